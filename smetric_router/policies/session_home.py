"""A session's home worker: where the client's session hint sends it when nothing else decides.

Rendezvous (highest-random-weight) hashing ranks the workers for a hint: every router replica
ranks them the same way with no shared state, and a worker joining or leaving moves only the
sessions whose first choice it is. The hash is BLAKE2b, not Python's hash(), which is salted
per process. A hint never overrides the cluster view: policies consult it only where the view
leaves the choice open (see smetric.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from smetric_router.core.types import WorkerView


def rank(hint: str, url: str) -> int:
    digest = hashlib.blake2b(f"{hint}\0{url}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def home(hint: str, workers: Sequence[WorkerView]) -> WorkerView:
    """The highest-ranked of workers (non-empty) for the hint."""
    return max(workers, key=lambda w: rank(hint, w.url))
