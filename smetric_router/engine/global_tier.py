"""A global KV tier shared by engines (Mooncake behind SGLang HiCache): pages by hash, LRU."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

from smetric_router.core.prefix import leading_run


class KvTier(Protocol):
    """What the engine asks of a global tier, by page hash; GlobalTier is the in-memory model,
    the emulator's MooncakeTier a real store."""

    def peek(self, page_hashes: Sequence[int]) -> int: ...

    def lookup(self, page_hashes: Sequence[int]) -> int: ...

    def store(self, page_hashes: Sequence[int]) -> None: ...


class GlobalTier:
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

    def __len__(self) -> int:
        return len(self._pages)

    def __contains__(self, page_hash: int) -> bool:
        return page_hash in self._pages

    def lookup(self, page_hashes: Sequence[int]) -> int:
        """Leading pages present; they count as used (moved to most recent)."""
        n = self.peek(page_hashes)
        if not self._unbounded:
            for h in page_hashes[:n]:
                self._lru.move_to_end(h)
        return n

    def peek(self, page_hashes: Sequence[int]) -> int:
        """Leading pages present, without touching the LRU order."""
        return leading_run(self._pages, page_hashes)

    def store(self, page_hashes: Sequence[int]) -> None:
        if self._unbounded:
            self._set.update(page_hashes)
            return
        pages = self._lru
        for h in page_hashes:
            pages[h] = None
            pages.move_to_end(h)
        while len(pages) > self.capacity_pages:
            pages.popitem(last=False)
