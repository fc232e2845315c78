"""A global KV tier shared by engines (Mooncake behind SGLang HiCache): pages by hash, LRU."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence


class GlobalTier:
    def __init__(self, capacity_tokens: float = math.inf, page_size: int = 16) -> None:
        self.page_size = page_size
        self.capacity_pages = (
            math.inf if math.isinf(capacity_tokens) else capacity_tokens // page_size
        )
        self._pages: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pages)

    def __contains__(self, page_hash: int) -> bool:
        return page_hash in self._pages

    def lookup(self, page_hashes: Sequence[int]) -> int:
        """Leading pages present; they count as used (moved to most recent)."""
        n = self.peek(page_hashes)
        for h in page_hashes[:n]:
            self._pages.move_to_end(h)
        return n

    def peek(self, page_hashes: Sequence[int]) -> int:
        """Leading pages present, without touching the LRU order."""
        n = 0
        for h in page_hashes:
            if h not in self._pages:
                break
            n += 1
        return n

    def store(self, page_hashes: Sequence[int]) -> None:
        pages = self._pages
        if math.isinf(self.capacity_pages):
            # nothing is ever evicted, so the LRU order does not matter: skip maintaining it
            pages.update(dict.fromkeys(page_hashes))
            return
        for h in page_hashes:
            pages[h] = None
            pages.move_to_end(h)
        while len(pages) > self.capacity_pages:
            pages.popitem(last=False)
