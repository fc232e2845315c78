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

The grace only bridges the events' lag, so it never outvotes them: once the worker's KV events
remove or clear pages (KvIndex's eviction listener), its ended requests' pages are forgotten
(forget_ended) and the index speaks for it; pages of requests still in flight stay (a queued
request's prefix is cached again when it runs).

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
# holder at all. An eviction the worker reports meanwhile ends it early (forget_ended).
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
        # Per worker: pages of requests in flight, and of requests ended within the grace.
        self._live: dict[str, _Counts] = {}
        self._ended: dict[str, _Counts] = {}
        # (expires at, ended table, hashes) of released holds, in expiry order (constant grace).
        self._expiring: deque[tuple[float, _Counts, Sequence[int]]] = deque()

    def hold(self, worker: str, page_hashes: Sequence[int]) -> Hold:
        """The request's pages count as held by `worker` until release()."""
        self._expire()
        if not page_hashes:  # nothing to hold (a prompt shorter than a page)
            return Hold(worker, page_hashes, {})
        counts = self._live.setdefault(worker, {})
        _add(counts, page_hashes)
        return Hold(worker, page_hashes, counts)

    def release(self, hold: Hold, *, grace: bool = True) -> None:
        """The request ended. grace: it reached the worker, whose KV events may still be on their
        way (its pages stay GRACE_S more, or until forget_ended()); False: it never ran there
        (refused, 5xx, 4xx)."""
        if hold.released:
            return
        hold.released = True
        current = self._live.get(hold.worker) is hold._counts  # not since detached
        self._drop(self._live, hold.worker, hold._counts, hold.page_hashes)
        if grace and self.grace_s > 0 and hold.page_hashes and current:
            ended = self._ended.setdefault(hold.worker, {})
            _add(ended, hold.page_hashes)
            self._expiring.append((self._clock() + self.grace_s, ended, hold.page_hashes))
        self._expire()

    def match(self, page_hashes: Sequence[int], page_size: int) -> dict[str, int]:
        """Leading prompt tokens each worker holds in flight (workers holding none are left out)."""
        self._expire()
        out: dict[str, int] = {}
        if not page_hashes:
            return out
        none: _Counts = {}
        for worker in self._live.keys() | self._ended.keys():
            live, ended = self._live.get(worker, none), self._ended.get(worker, none)
            if page_hashes[0] not in live and page_hashes[0] not in ended:
                continue
            lo, hi = 1, len(page_hashes)  # pages held: in [lo, hi]
            while lo < hi:
                mid = (lo + hi + 1) >> 1
                h = page_hashes[mid - 1]
                if h in live or h in ended:
                    lo = mid
                else:
                    hi = mid - 1
            out[worker] = lo * page_size
        return out

    def forget_ended(self, worker: str) -> None:
        """The worker's own KV events now speak for its cache (they evicted or cleared pages):
        the ended requests' pages stop being credited; those in flight stay (a queued request's
        prefix is cached again when it runs)."""
        self._ended.pop(worker, None)  # queued expiries detach

    def remove_worker(self, worker: str) -> None:
        """Forget the worker's pages (removed, unhealthy, flushed); its live holds detach."""
        self._live.pop(worker, None)
        self._ended.pop(worker, None)

    def pages(self, worker: str) -> int:
        """Distinct pages held in flight (or ended within the grace) on the worker (metrics)."""
        self._expire()
        live, ended = self._live.get(worker, {}), self._ended.get(worker, {})
        return len(live) + sum(1 for h in ended if h not in live)

    def _expire(self) -> None:
        now = self._clock()
        q = self._expiring
        while q and q[0][0] <= now:
            _, counts, hashes = q.popleft()
            for worker, table in self._ended.items():
                if table is counts:
                    self._drop(self._ended, worker, counts, hashes)
                    break

    @staticmethod
    def _drop(
        tables: dict[str, _Counts], worker: str, counts: _Counts, hashes: Sequence[int]
    ) -> None:
        for h in hashes:
            n = counts.get(h, 0)
            if n > 1:
                counts[h] = n - 1
            else:
                counts.pop(h, None)
        if not counts and tables.get(worker) is counts:
            del tables[worker]  # a detached table (removed worker) is garbage once released


def _add(counts: _Counts, hashes: Sequence[int]) -> None:
    for h in hashes:
        counts[h] = counts.get(h, 0) + 1
