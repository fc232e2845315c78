"""A global KV tier shared by engines (Mooncake behind SGLang HiCache, LMCache's RDMA pool): pages
by hash, LRU, each readable from the time its write completed."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
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
    """Pages by hash with the time each becomes readable (its write-through completed).

    Without times (store's ready_at and peek's now left at their defaults) every page is readable
    as soon as it is stored, which is what the engine tests and the emulator's users expect.
    """

    def __init__(self, capacity_tokens: float = math.inf, page_size: int = 16) -> None:
        self.page_size = page_size
        self.capacity_pages = (
            math.inf if math.isinf(capacity_tokens) else capacity_tokens // page_size
        )
        # unbounded: nothing is ever evicted, so no LRU order is kept (a dict is cheaper)
        self._unbounded = math.isinf(self.capacity_pages)
        self._pages: dict[int, float] = {} if self._unbounded else OrderedDict()
        # no page becomes readable later than this: peeks at or after it skip the ready check
        self._latest_ready = 0.0

    def __len__(self) -> int:
        return len(self._pages)

    def __contains__(self, page_hash: int) -> bool:
        """Stored, whether or not its write has completed."""
        return page_hash in self._pages

    def lookup(self, page_hashes: Sequence[int], now: float = math.inf) -> int:
        """Leading pages readable at `now`; they count as used (moved to most recent)."""
        n = self.peek(page_hashes, now)
        if not self._unbounded:
            lru = self._pages
            assert isinstance(lru, OrderedDict)
            for h in page_hashes[:n]:
                lru.move_to_end(h)
        return n

    def peek(self, page_hashes: Sequence[int], now: float = math.inf) -> int:
        """Leading pages readable at `now`, without touching the LRU order."""
        pages = self._pages
        n = leading_run(pages, page_hashes)
        if n and now < self._latest_ready:
            ready = list(map(pages.__getitem__, page_hashes[:n]))
            if max(ready) > now:
                n = next(i for i, r in enumerate(ready) if r > now)
        return n

    def missing(self, page_hashes: Sequence[int]) -> list[int]:
        """The pages not stored (nor being written): what a write-through has to send."""
        pages = self._pages
        return [h for h in dict.fromkeys(page_hashes) if h not in pages]

    def store(self, page_hashes: Sequence[int], ready_at: float = 0.0) -> None:
        """Store pages readable from ready_at; a page already stored keeps its earlier time."""
        pages = self._pages
        if ready_at > self._latest_ready:
            self._latest_ready = ready_at
        if self._unbounded:
            pages.update(dict.fromkeys([h for h in page_hashes if h not in pages], ready_at))
            return
        assert isinstance(pages, OrderedDict)
        for h in page_hashes:
            pages[h] = min(pages.get(h, ready_at), ready_at)
            pages.move_to_end(h)
        while len(pages) > self.capacity_pages:
            pages.popitem(last=False)
