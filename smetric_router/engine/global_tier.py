"""A global KV tier shared by engines (Mooncake behind SGLang HiCache, LMCache's RDMA pool): pages
by hash, LRU, each readable from the time its write completed."""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from itertools import repeat
from typing import Protocol

from smetric_router.core.prefix import leading_run


class KvTier(Protocol):
    """What the engine asks of a global tier, by page hash; GlobalTier is the in-memory model
    (the simulator puts a per-instance sim.tiers.TierPort in front of it, which supplies the
    time), the emulator's MooncakeTier a real store."""

    def peek(self, page_hashes: Sequence[int]) -> int: ...

    def lookup(self, page_hashes: Sequence[int]) -> int: ...

    def store(self, page_hashes: Sequence[int]) -> None: ...


class GlobalTier:
    """Pages by hash, each readable once its write-through completed.

    Times are optional: store's ready_at defaults to 0 and peek's / lookup's now to inf, so the
    engine tests and the emulator's users see every stored page at once. With times, the pages
    still being written sit in a small side table until a query's `now` passes their ready time;
    queries must come in nondecreasing `now` (the simulator's event order), which keeps the
    per-page state of the (large) tier a plain set.
    """

    def __init__(self, capacity_tokens: float = math.inf, page_size: int = 16) -> None:
        self.page_size = page_size
        self.capacity_pages = (
            math.inf if math.isinf(capacity_tokens) else capacity_tokens // page_size
        )
        # unbounded: nothing is ever evicted, so no LRU order is kept (a set is much cheaper)
        self._unbounded = math.isinf(self.capacity_pages)
        self._set: set[int] = set()
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._pages: set[int] | OrderedDict[int, None] = self._set if self._unbounded else self._lru
        self._writing: dict[int, float] = {}  # page -> ready time, for pages not yet readable
        self._writes: list[tuple[float, int, list[int]]] = []  # heap of (ready, seq, pages)
        self._seq = 0
        self._now = 0.0  # the latest time a query was made at

    def __len__(self) -> int:
        return len(self._pages)

    def __contains__(self, page_hash: int) -> bool:
        """Stored, whether or not its write has completed."""
        return page_hash in self._pages

    def lookup(self, page_hashes: Sequence[int], now: float = math.inf) -> int:
        """Leading pages readable at `now`; they count as used (moved to most recent)."""
        n = self.peek(page_hashes, now)
        if not self._unbounded:
            for h in page_hashes[:n]:
                self._lru.move_to_end(h)
        return n

    def peek(self, page_hashes: Sequence[int], now: float = math.inf) -> int:
        """Leading pages readable at `now`, without touching the LRU order."""
        if math.isinf(now):
            return leading_run(self._pages, page_hashes)
        if self._writes and self._writes[0][0] <= now:
            self._settle(now)
        return self.readable(page_hashes)

    def readable(self, page_hashes: Sequence[int]) -> int:
        """Leading pages readable as of the latest query, without advancing time or touching the
        LRU order: what a router asking the store's master sees between the engine's steps (a
        page still being written is not there yet)."""
        n = leading_run(self._pages, page_hashes)
        if n and self._writing:
            writing = self._writing
            head = page_hashes[:n]
            if not writing.keys().isdisjoint(head):
                n = next(i for i, h in enumerate(head) if h in writing)
        return n

    def _settle(self, now: float) -> None:
        """Pages whose write completed by `now` become readable."""
        self._now = max(self._now, now)
        writes, pop = self._writes, self._writing.pop
        while writes and writes[0][0] <= now:
            # a page re-stored with an earlier time left this batch's entry stale; popping it
            # again is a no-op (a bounded tier's page evicted and re-stored may turn readable
            # at its first write's time: rare, and early by at most that write's lag)
            deque(map(pop, heapq.heappop(writes)[2], repeat(None)), maxlen=0)

    def missing(self, page_hashes: Sequence[int]) -> list[int]:
        """The pages not stored (nor being written): what a write-through has to send."""
        if self._unbounded:
            return list(set(page_hashes).difference(self._set))  # C speed; order is moot
        pages = self._pages
        return [h for h in dict.fromkeys(page_hashes) if h not in pages]

    def store(self, page_hashes: Sequence[int], ready_at: float = 0.0) -> None:
        """Store pages readable from ready_at; a page already stored keeps its earlier time."""
        if ready_at > self._now:
            writing = self._writing
            if self._unbounded:
                late = set(page_hashes).difference(self._set)
            else:  # set - OrderedDict would walk the whole tier
                late = {h for h in page_hashes if h not in self._lru}
            if writing:  # stored pages still being written, later than this write
                late.update(h for h in writing.keys() & set(page_hashes) if writing[h] > ready_at)
            if late:
                writing.update(dict.fromkeys(late, ready_at))
                self._seq += 1
                heapq.heappush(self._writes, (ready_at, self._seq, list(late)))
        if self._unbounded:
            self._set.update(page_hashes)
            return
        pages = self._lru
        for h in page_hashes:
            pages[h] = None
            pages.move_to_end(h)
        while len(pages) > self.capacity_pages:
            self._writing.pop(pages.popitem(last=False)[0], None)
