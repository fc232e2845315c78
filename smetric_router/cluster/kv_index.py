"""Which page hashes each worker holds, per tier, answering longest-prefix matches for all workers.

Two views are indexed: GPU (the device tier alone) and local (GPU or CPU_PINNED host tier).
Each view maps a page hash to a bitmask of the workers holding it.

The invariant matching relies on (see NOTES.md): SGLang's page hash covers every token before the
page, and its radix cache is prefix-closed per view (it evicts leaves first and stores parents
first), so a worker holding page k of a prompt holds pages 1..k. Two regimes follow:

- complete history (the feed saw the worker's events from its seq 0, or from an AllBlocksCleared):
  every parent was announced, so the index is kept prefix-closed by construction: a store is
  accepted only when its parent page is held in the same view (else `rejected`), and removing a
  page that still has held children drops the orphaned subtree. `match` binary-searches the
  leading run for all workers at once;
- partial history (`set_partial`: the feed joined, or re-joined after lost events, while the
  worker already held pages it will never announce again, since SGLang never re-announces a
  parent it already announced): a store whose parent is unknown is accepted as an *orphan root*.
  Its chain from the root is unknown, so a walk from the root cannot reach it; for such a worker
  `match` answers the deepest page of the prompt the worker holds (held page k implies 1..k,
  above), scanning the prompt's pages from the end. Pages stored before the feed joined and
  never re-stored stay unknown: under-reporting, never stale.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from smetric_router.core.kv_events import (
    CPU_PINNED,
    EXTERNAL,
    GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)
from smetric_router.core.prefix import leading_run

log = logging.getLogger(__name__)

_GPU = 1
_HOST = 2
# The fork's L3 events (patches/): a page written to (or removed from) the shared global store.
L3_MEDIUM = EXTERNAL


def _tier(medium: str | None) -> int | None:
    # Events without a medium come from publishers that know only the device tier.
    if medium is None or medium == GPU:
        return _GPU
    if medium == CPU_PINNED:
        return _HOST
    return None


@dataclass(frozen=True, slots=True)
class WorkerIndexStats:
    """Pages held per tier, and how often the events broke prefix closure (see NOTES.md)."""

    gpu_pages: int
    host_pages: int
    rejected_stores: int
    repairs: int
    orphan_roots: int = 0  # pages stored under a parent announced before the feed joined


class _WorkerState:
    """One worker's pages: tiers held, parent links and held-children counts per view."""

    __slots__ = ("bit", "kids_gpu", "kids_local", "orphans", "parent", "partial", "rejected",
                 "repairs", "tiers")  # fmt: skip

    def __init__(self, bit: int) -> None:
        self.bit = bit
        self.tiers: dict[int, int] = {}
        self.parent: dict[int, int | None] = {}
        self.kids_gpu: dict[int, int] = {}
        self.kids_local: dict[int, int] = {}
        self.rejected = 0  # stores whose parent was not held (under-reporting, never stale)
        self.repairs = 0  # removals that orphaned held children
        self.partial = False  # history incomplete: stores under unknown parents are accepted
        self.orphans: set[int] = set()  # pages accepted without a held parent (partial only)


def _dec(counts: dict[int, int], key: int) -> None:
    n = counts[key] - 1
    if n:
        counts[key] = n
    else:
        del counts[key]


class KvIndex:
    def __init__(self) -> None:
        self._workers: dict[str, _WorkerState] = {}
        self._gpu: dict[int, int] = {}
        self._local: dict[int, int] = {}
        self._free_bits: list[int] = []
        self._orphan_bits = 0  # workers holding orphan roots: matched by deepest page
        self._next_bit = 0
        # L3 is one store shared by all workers: a page any worker wrote there is held for all.
        self._l3: set[int] = set()
        # Told the worker after its events removed or cleared local pages (or its view was
        # cleared): the router's in-flight view then stops crediting its ended requests.
        self.on_evicted: Callable[[str], None] | None = None

    # -- membership -------------------------------------------------------------------------

    def add_worker(self, worker: str) -> None:
        if worker in self._workers:
            return
        if self._free_bits:
            bit = self._free_bits.pop()
        else:
            bit = 1 << self._next_bit
            self._next_bit += 1
        self._workers[worker] = _WorkerState(bit)

    def remove_worker(self, worker: str) -> None:
        if worker not in self._workers:
            return
        self.clear(worker)
        self._free_bits.append(self._workers.pop(worker).bit)

    def workers(self) -> list[str]:
        return list(self._workers)

    def set_partial(self, worker: str, partial: bool) -> None:
        """Whether the worker's events are followed from an incomplete history (see the module
        docstring). An AllBlocksCleared makes it complete again: the cache is empty then."""
        self.add_worker(worker)
        self._workers[worker].partial = partial

    def clear(self, worker: str) -> None:
        st = self._workers.get(worker)
        if st is not None:
            self._clear_state(st)
        if self.on_evicted is not None:
            self.on_evicted(worker)

    def _clear_state(self, st: _WorkerState) -> None:
        for h, t in st.tiers.items():
            if t & _GPU:
                self._unset(self._gpu, h, st.bit)
            self._unset(self._local, h, st.bit)
        st.tiers.clear()
        st.parent.clear()
        st.kids_gpu.clear()
        st.kids_local.clear()
        st.orphans.clear()
        self._orphan_bits &= ~st.bit

    # -- events -----------------------------------------------------------------------------

    def apply(self, worker: str, batch: KVEventBatch) -> None:
        self.add_worker(worker)
        st = self._workers[worker]
        evicted = False
        for ev in batch.events:
            if isinstance(ev, BlockStored | BlockRemoved) and ev.medium == L3_MEDIUM:
                self._apply_l3(ev)
            elif isinstance(ev, BlockStored):
                tier = _tier(ev.medium)
                if tier is None:
                    continue
                parent = ev.parent_block_hash
                for h in ev.block_hashes:
                    self._store(st, h, parent, tier)
                    parent = h
            elif isinstance(ev, BlockRemoved):
                tier = _tier(ev.medium)
                if tier is None:
                    continue
                evicted = True
                # SGLang lists an evicted chain root first, so a page may go before its children
                # in the same event: only what the whole event leaves orphaned needs a repair.
                parents = [h for h in ev.block_hashes if self._remove(st, h, tier)]
                if parents and self._orphaned(st, parents, tier):
                    st.repairs += 1
                    self._repair(st)
            elif isinstance(ev, AllBlocksCleared):
                self.clear(worker)
                st.partial = False
        if evicted and self.on_evicted is not None:
            self.on_evicted(worker)

    def _apply_l3(self, ev: BlockStored | BlockRemoved) -> None:
        if isinstance(ev, BlockStored):
            self._l3.update(ev.block_hashes)
        else:
            self._l3.difference_update(ev.block_hashes)

    def clear_l3(self) -> None:
        """The store restarted (it keeps keys in memory only): nothing is in L3 any more."""
        self._l3.clear()

    def _store(self, st: _WorkerState, h: int, parent: int | None, tier: int) -> None:
        old = st.tiers.get(h, 0)
        if old & tier:
            return
        orphan = False
        if parent is not None:
            pt = st.tiers.get(parent, 0)
            if not (pt & _GPU if tier == _GPU else pt):
                if not st.partial:
                    st.rejected += 1
                    return
                orphan = True
        if orphan and h not in st.orphans:
            st.orphans.add(h)
            self._orphan_bits |= st.bit
        if not old:
            st.parent[h] = parent
            self._local[h] = self._local.get(h, 0) | st.bit
            if parent is not None:
                st.kids_local[parent] = st.kids_local.get(parent, 0) + 1
        if tier == _GPU:
            self._gpu[h] = self._gpu.get(h, 0) | st.bit
            if parent is not None:
                st.kids_gpu[parent] = st.kids_gpu.get(parent, 0) + 1
        st.tiers[h] = old | tier

    def _remove(self, st: _WorkerState, h: int, tier: int) -> bool:
        """Drop `tier` from page h; True if h then still had held children in a view it left."""
        old = st.tiers.get(h, 0)
        if not old & tier:
            return False
        parent = st.parent[h]
        orphans = False
        if tier == _GPU:
            orphans = h in st.kids_gpu
            self._unset(self._gpu, h, st.bit)
            if parent is not None:
                _dec(st.kids_gpu, parent)
        new = old & ~tier
        if new:
            st.tiers[h] = new
        else:
            orphans = orphans or h in st.kids_local
            del st.tiers[h]
            del st.parent[h]
            if h in st.orphans:
                st.orphans.discard(h)
                if not st.orphans:
                    self._orphan_bits &= ~st.bit
            self._unset(self._local, h, st.bit)
            if parent is not None:
                _dec(st.kids_local, parent)
        return orphans

    @staticmethod
    def _orphaned(st: _WorkerState, removed: list[int], tier: int) -> bool:
        """Whether a page removed from `tier` still has held children in a view it left (a
        radix cache evicts leaves first; a publisher that did not needs a repair)."""
        for h in removed:
            if tier == _GPU and h in st.kids_gpu:
                return True
            if h not in st.tiers and h in st.kids_local:
                return True
        return False

    def _repair(self, st: _WorkerState) -> None:
        """Keep of each page only the tiers its ancestry still supports (the store admission
        rule applied afresh); rare, O(pages of this worker)."""
        kept: dict[int, int] = {}
        for h in st.tiers:
            path: list[int] = []
            cur: int | None = h
            while cur is not None and cur not in kept and cur in st.tiers:
                path.append(cur)
                cur = st.parent[cur]
            # what the parent of path[-1] provides: everything for a root (or an orphan root,
            # whose parent was never announced), nothing if not held
            if cur is None or (cur not in st.tiers and path[-1] in st.orphans):
                above = _GPU | _HOST
            else:
                above = kept.get(cur, 0)
            for node in reversed(path):
                t = st.tiers[node]
                keep = (t & _HOST) | (t & _GPU if above & _GPU else 0) if above else 0
                kept[node] = above = keep
        pages = [(h, st.parent[h], t) for h, t in kept.items() if t]
        orphans = {h for h, _, _ in pages if h in st.orphans}
        self._clear_state(st)
        st.orphans = orphans
        if orphans:
            self._orphan_bits |= st.bit
        for h, parent, t in pages:
            st.tiers[h] = t
            st.parent[h] = parent
            self._local[h] = self._local.get(h, 0) | st.bit
            if parent is not None:
                st.kids_local[parent] = st.kids_local.get(parent, 0) + 1
            if t & _GPU:
                self._gpu[h] = self._gpu.get(h, 0) | st.bit
                if parent is not None:
                    st.kids_gpu[parent] = st.kids_gpu.get(parent, 0) + 1

    @staticmethod
    def _unset(masks: dict[int, int], h: int, bit: int) -> None:
        m = masks.get(h, 0) & ~bit
        if m:
            masks[h] = m
        else:
            masks.pop(h, None)

    # -- queries ----------------------------------------------------------------------------

    def match(self, page_hashes: Sequence[int], page_size: int) -> dict[str, tuple[int, int]]:
        """Per known worker: (GPU-tier hit tokens, local-tier hit tokens) of the longest cached
        prefix of `page_hashes`."""
        gpu = _prefix_lengths(self._gpu, page_hashes)
        local = _prefix_lengths(self._local, page_hashes)
        if self._orphan_bits:
            for lengths, masks in ((gpu, self._gpu), (local, self._local)):
                for bit in _bits(self._orphan_bits):
                    lengths.pop(bit, None)
                lengths.update(_deepest(masks, page_hashes, self._orphan_bits))
        out: dict[str, tuple[int, int]] = {}
        for w, st in self._workers.items():
            out[w] = (gpu.get(st.bit, 0) * page_size, local.get(st.bit, 0) * page_size)
        return out

    def l3_match(self, page_hashes: Sequence[int], page_size: int) -> int:
        """Leading prompt tokens in L3 by the workers' L3 events (a walk: L3 is not kept
        prefix-closed, pages are written and evicted there one by one)."""
        return leading_run(self._l3, page_hashes) * page_size

    @property
    def l3_pages(self) -> int:
        return len(self._l3)

    def stats(self, worker: str) -> WorkerIndexStats:
        st = self._workers.get(worker)
        if st is None:
            return WorkerIndexStats(0, 0, 0, 0)
        g = sum(1 for t in st.tiers.values() if t & _GPU)
        h = sum(1 for t in st.tiers.values() if t & _HOST)
        return WorkerIndexStats(g, h, st.rejected, st.repairs, len(st.orphans))


def _prefix_lengths(masks: dict[int, int], hashes: Sequence[int]) -> dict[int, int]:
    """Longest held prefix, in pages, per worker bit with a non-zero prefix.

    Relies on each worker's pages being prefix-closed within `masks`, so that the set of
    workers holding page k only shrinks as k grows; a binary search over [lo, hi] then splits
    the candidate workers at each probe. At most (workers x log2(pages)) lookups.
    """
    out: dict[int, int] = {}
    n = len(hashes)
    if n == 0:
        return out
    get = masks.get
    first = get(hashes[0], 0)
    if not first:
        return out
    # (lo, hi, cand): every worker in cand holds exactly lo..hi leading pages, lo >= 1
    stack: list[tuple[int, int, int]] = [(1, n, first)]
    while stack:
        lo, hi, cand = stack.pop()
        if lo == hi:
            _assign(out, cand, lo)
            continue
        mid = (lo + hi + 1) >> 1
        above = get(hashes[mid - 1], 0) & cand
        if above:
            stack.append((mid, hi, above))
        below = cand & ~above
        if below:
            stack.append((lo, mid - 1, below))
    return out


def _deepest(masks: dict[int, int], hashes: Sequence[int], bits: int) -> dict[int, int]:
    """Per worker bit in `bits`: 1 + the index of the last page of `hashes` it holds (held page k
    implies pages 1..k, see the module docstring). O(pages) lookups at worst."""
    out: dict[int, int] = {}
    get = masks.get
    for k in range(len(hashes) - 1, -1, -1):
        found = get(hashes[k], 0) & bits
        if found:
            _assign(out, found, k + 1)
            bits &= ~found
            if not bits:
                break
    return out


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low)
        mask ^= low
    return out


def _assign(out: dict[int, int], mask: int, pages: int) -> None:
    while mask:
        low = mask & -mask
        out[low] = pages
        mask ^= low
