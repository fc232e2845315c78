"""Rate control by sampling sessions, the paper's way (§5.1: the testbed "samples [the trace] to
control the request rate"): each session is kept whole, at its original timing, or dropped whole.

Beside time-stretching (`sim --rate-scale`), which keeps every session but slows the clock, so an
agent's seconds between turns become tens of seconds and a cached history waits longer for its
next turn, sampling keeps the trace's own gaps and lowers the rate by running fewer sessions at
once. A session's fate is a stable hash of (seed, session id): the same seed keeps the same
sessions in any order and at any fraction, and a larger fraction keeps a superset."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from smetric_router.traces.schema import TraceRequest


def session_draw(seed: int, session: str) -> float:
    """The session's uniform draw in [0, 1) for this seed."""
    digest = hashlib.blake2b(f"{seed}:{session}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def sample_sessions(reqs: Sequence[TraceRequest], fraction: float, seed: int) -> list[TraceRequest]:
    """The requests of the sessions whose draw falls below `fraction` (0 < fraction <= 1)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"a session sample's fraction must be in (0, 1], got {fraction:g}")
    keep: dict[str, bool] = {}
    out = []
    for r in reqs:
        kept = keep.get(r.session)
        if kept is None:
            kept = keep[r.session] = session_draw(seed, r.session) < fraction
        if kept:
            out.append(r)
    return out
