"""In-flight prefixes: the pages of requests the router has sent to a worker and whose KV events
have not arrived yet.

The KV-event index (kv_index.py) learns what a worker caches only after the worker has computed
it, so a follow-up or a forked request that arrives while its prefix is still being prefilled (or
before the prefix's events crossed the wire) sees no holder and is balanced away. The router knows
better: it sent that prefix to one worker. So, from dispatch until the request ends plus
GRACE_S, the request's page hashes count as held by that worker, and the router's view takes
max(KV-index hit, in-flight hit) per worker.

Invariant (what `match` relies on): per worker, the held hashes are prefix-closed. Every hold is a
request's whole leading chain (page_hashes[0:n], chained SGLang hashes: page k's hash names pages
0..k), refcounted per hash and taken back whole, so count(h[k-1]) >= count(h[k]) along any chain.
`match` can then binary-search each worker's leading run.

Bounds: entries live only while their request is in flight and for GRACE_S after, so the
structure grows with concurrency, not with sessions. A worker's entries are dropped when it is
removed, found unhealthy or flushed; holds taken before that are then released into a detached
table, harmlessly.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# A finished request's pages stay counted this long: its worker publishes their KV events while
# prefilling, but they reach the router's index a few ms (and, under load or after a replay, up to
# a second or so) later. Without the grace a follow-up arriving in that window would see no
# holder at all. Longer only matters if the worker evicts the pages meanwhile (over-report).
GRACE_S = 2.0

_Counts = dict[int, int]  # page hash -> holds


@dataclass(slots=True)
class Hold:
    """One dispatched request's pages on one worker; released exactly once."""

    worker: str
    page_hashes: Sequence[int]
    _counts: _Counts = field(repr=False)
    released: bool = False


class InflightPrefixes:
    def __init__(self, grace_s: float = GRACE_S, clock: Callable[[], float] = time.monotonic):
        self.grace_s = grace_s
        self._clock = clock
        self._workers: dict[str, _Counts] = {}
        # (expires at, table, hashes) of released holds, in expiry order (constant grace).
        self._expiring: deque[tuple[float, _Counts, Sequence[int]]] = deque()

    def hold(self, worker: str, page_hashes: Sequence[int]) -> Hold:
        """The request's pages count as held by `worker` until release()."""
        self._expire()
        if not page_hashes:  # nothing to hold (a prompt shorter than a page)
            return Hold(worker, page_hashes, {})
        counts = self._workers.setdefault(worker, {})
        for h in page_hashes:
            counts[h] = counts.get(h, 0) + 1
        return Hold(worker, page_hashes, counts)

    def release(self, hold: Hold, *, grace: bool = True) -> None:
        """The request ended. grace: it reached the worker, whose KV events may still be on their
        way (its pages stay GRACE_S more); False: it never ran there (refused, 5xx, 4xx)."""
        if hold.released:
            return
        hold.released = True
        if grace and self.grace_s > 0 and hold.page_hashes:
            self._expiring.append((self._clock() + self.grace_s, hold._counts, hold.page_hashes))
        else:
            self._drop(hold._counts, hold.page_hashes)
        self._expire()

    def match(self, page_hashes: Sequence[int], page_size: int) -> dict[str, int]:
        """Leading prompt tokens each worker holds in flight (workers holding none are left out)."""
        self._expire()
        out: dict[str, int] = {}
        if not page_hashes:
            return out
        for worker, counts in self._workers.items():
            if page_hashes[0] not in counts:
                continue
            lo, hi = 1, len(page_hashes)  # pages held: in [lo, hi]
            while lo < hi:
                mid = (lo + hi + 1) >> 1
                if page_hashes[mid - 1] in counts:
                    lo = mid
                else:
                    hi = mid - 1
            out[worker] = lo * page_size
        return out

    def remove_worker(self, worker: str) -> None:
        """Forget the worker's pages (removed, unhealthy, flushed); its live holds detach."""
        self._workers.pop(worker, None)

    def pages(self, worker: str) -> int:
        """Distinct pages held in flight on the worker (for the metrics)."""
        self._expire()
        return len(self._workers.get(worker, ()))

    def _expire(self) -> None:
        now = self._clock()
        q = self._expiring
        while q and q[0][0] <= now:
            _, counts, hashes = q.popleft()
            self._drop(counts, hashes)

    def _drop(self, counts: _Counts, hashes: Sequence[int]) -> None:
        for h in hashes:
            n = counts.get(h, 0)
            if n > 1:
                counts[h] = n - 1
            else:
                counts.pop(h, None)
        if not counts:
            # Only the worker's current table, and only once empty (a detached one is garbage).
            for worker, table in list(self._workers.items()):
                if table is counts:
                    del self._workers[worker]
                    break
