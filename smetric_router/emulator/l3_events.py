"""KV events for the emulated worker's global tier (HiCache's L3 on Mooncake), as SGLang 0.5.23
with smetric's l3-events patch publishes them (patches/README.md, "L3 KV events"); stock SGLang
publishes none, so the emulator does only with `--l3-kv-events`.

- After a write to the store: one `BlockStored` with medium `EXTERNAL` per run of consecutive
  pages the write found stored (put, or already there: Mooncake counts an existing key as
  stored, so a page another worker wrote is announced by this one too), `parent_block_hash` the
  page before the run in the token chain (None at the root), whether or not that page is in L3.
- When the store is cleared (`POST /hicache/storage-backend/clear`): one `BlockRemoved` with
  medium `EXTERNAL` of every page this worker announced since its last clear (at most
  MAX_ANNOUNCED, the oldest dropped first). The clear empties the store for every worker, but
  only the worker asked announces it, and only what it announced.
- `/flush_cache` does not touch L3 (its `AllBlocksCleared` is the worker's own tiers).

Unlike the patch, `token_ids` is empty: the tier knows a page by its hash and digest only, as the
engine's token-free pages are published; the consumers of L3 events (the router's
cluster/kv_index.py) read the hashes. Called from the tier's one I/O thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from smetric_router.core.kv_events import EXTERNAL, BlockRemoved, BlockStored, KVCacheEvent

MAX_ANNOUNCED = 1 << 20  # the patch's bound on what a clear lists

# (page hash, the hash of the page before it in the token chain; None at the root)
Page = tuple[int, int | None]


class L3Announcer:
    def __init__(self, publish: Callable[[list[KVCacheEvent]], None], page_size: int) -> None:
        self._publish = publish
        self._page_size = page_size
        self._announced: dict[int, None] = {}  # oldest first

    def stored(self, pages: Sequence[Page], ok: Sequence[bool]) -> None:
        """A write's pages in the order written, and whether the store holds each now."""
        runs: list[tuple[list[int], int | None]] = []  # (pages, the page before the first)
        current: tuple[list[int], int | None] | None = None
        for (h, before), held in zip(pages, ok, strict=True):
            if not held:
                current = None
            elif current is not None and before == current[0][-1]:
                current[0].append(h)
            else:
                current = ([h], before)
                runs.append(current)
        if not runs:
            return
        announced = self._announced
        for run, _ in runs:
            for h in run:
                announced.pop(h, None)
                announced[h] = None
        while len(announced) > MAX_ANNOUNCED:
            del announced[next(iter(announced))]
        self._publish([self._event(run, before) for run, before in runs])

    def cleared(self) -> None:
        """The store was emptied on this worker's request."""
        if self._announced:
            self._publish([BlockRemoved(list(self._announced), medium=EXTERNAL)])
            self._announced = {}

    def _event(self, run: list[int], parent: int | None) -> BlockStored:
        return BlockStored(list(run), parent, [], self._page_size, None, medium=EXTERNAL)
