"""Paged radix cache with a GPU tier and an optional HiCache host tier.

Nodes are whole pages keyed by their SGLang page hash. The hash chains over the whole prefix, so a
flat dict from hash to node is the radix tree: a page's parent is the page before it in the
sequence that produced it (64-bit collisions are ignored, as SGLang's event consumers do).

Tier invariants:
- GPU residency is prefix-closed: only pages with no GPU-resident child are evicted from the GPU.
- With a host tier, GPU pages are written through to the host; evicting a page from the GPU keeps
  its host copy, and only host pages that are off the GPU and childless are evicted from the host.
- A running request locks only the deepest page it uses; its ancestors are protected because a
  page with a GPU child is never a GPU eviction candidate.

LRU is a heap with lazy entries: a page is pushed when it may have become evictable, and a popped
entry whose access stamp is stale is pushed back with the current stamp.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from smetric_router.core.kv_events import (
    CPU_PINNED,
    GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)


class PageNode:
    __slots__ = (
        "alive",
        "children",
        "gpu_children",
        "hash",
        "last",
        "lock",
        "on_gpu",
        "on_host",
        "parent",
        "tokens",
    )

    def __init__(
        self,
        page_hash: int,
        parent: PageNode | None,
        tokens: list[int],
        last: int,
        on_gpu: bool,
        on_host: bool,
        children: int = 0,
    ) -> None:
        self.hash = page_hash
        self.parent = parent
        self.tokens = tokens
        self.on_gpu = on_gpu
        self.on_host = on_host
        self.children = children  # children present in any tier
        self.gpu_children = children  # (a node is built with GPU children only inside a chain)
        self.lock = 0
        self.last = last
        self.alive = True


_HeapEntry = tuple[int, int, PageNode]


class RadixCache:
    def __init__(self, page_size: int, gpu_pages: int, host_pages: int = 0) -> None:
        self.page_size = page_size
        self.gpu_capacity = gpu_pages
        self.host_capacity = host_pages
        self.nodes: dict[int, PageNode] = {}
        self.gpu_used = 0
        self.host_used = 0
        self._clock = 0
        self._seq = 0
        self._gpu_heap: list[_HeapEntry] = []
        self._host_heap: list[_HeapEntry] = []

    # ---- lookup -------------------------------------------------------------------------------

    def match(self, hashes: Sequence[int]) -> tuple[list[PageNode], list[PageNode]]:
        """Leading pages on the GPU, then the pages after them held on the host only."""
        gpu: list[PageNode] = []
        host: list[PageNode] = []
        nodes = self.nodes
        for h in hashes:
            node = nodes.get(h)
            if node is None:
                break
            if node.on_gpu and not host:
                gpu.append(node)
            elif node.on_host:
                host.append(node)
            else:
                break
        return gpu, host

    def match_len(self, hashes: Sequence[int]) -> tuple[int, int]:
        """The lengths of match(hashes), without building lists. GPU residency is prefix-closed,
        so the GPU run is found by bisection. With a host tier larger than the GPU tier, a host
        page can always be evicted to make room, so every page gets a host copy when inserted
        and leaves the tree only as a leaf: then the pages present are prefix-closed too, and
        the present run is bisected first; the GPU run is most often all of it, which one look
        at its last page tells. Otherwise the host run is scanned (a host-only page can outlive
        its parent there)."""
        nodes = self.nodes
        if self.host_capacity > self.gpu_capacity:
            end, hi = 0, len(hashes)  # hashes[:end] are present, hashes[hi:] are not
            while end < hi:
                mid = (end + hi + 1) >> 1
                if hashes[mid - 1] in nodes:
                    end = mid
                else:
                    hi = mid - 1
            if end == 0 or nodes[hashes[end - 1]].on_gpu:
                return end, 0
            lo, hi = 0, end - 1  # hashes[:lo] are on the GPU, hashes[hi:] are not
            while lo < hi:
                mid = (lo + hi + 1) >> 1
                if nodes[hashes[mid - 1]].on_gpu:
                    lo = mid
                else:
                    hi = mid - 1
            return lo, end - lo
        lo, hi = 0, len(hashes)
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            node = nodes.get(hashes[mid - 1])
            if node is not None and node.on_gpu:
                lo = mid
            else:
                hi = mid - 1
        host = 0
        for i in range(lo, len(hashes)):
            node = nodes.get(hashes[i])
            if node is None or not node.on_host:
                break
            host += 1
        return lo, host

    def touch(self, deepest: PageNode | None) -> None:
        """Mark a matched prefix as just used: its deepest page and every page before it."""
        self._clock += 1
        stamp = self._clock
        node = deepest
        while node is not None:
            node.last = stamp
            node = node.parent

    def lock(self, node: PageNode | None) -> None:
        if node is not None:
            node.lock += 1

    def unlock(self, node: PageNode | None) -> None:
        if node is None:
            return
        node.lock -= 1
        if node.lock == 0 and node.alive:
            self._push(self._gpu_heap, node)

    # ---- insertion ----------------------------------------------------------------------------

    def insert(
        self, hashes: Sequence[int], tokens: Sequence[int], start: int, end: int
    ) -> tuple[PageNode | None, int, list[KVCacheEvent]]:
        """Make pages [start, end) of a sequence GPU-resident (pages < start must already be).

        Returns the deepest page, how many pages became newly GPU-resident, and the events.
        The caller has made room on the GPU. Pages are written through to the host tier, evicting
        host LRU pages for room; a page stays GPU-only when no host page can be evicted.
        """
        ps = self.page_size
        nodes = self.nodes
        parent = nodes[hashes[start - 1]] if start > 0 else None
        self._clock += 1
        stamp = self._clock
        gpu_run: list[int] = []
        gpu_runs: list[tuple[int, list[int]]] = []  # (first page index, hashes)
        host_runs: list[tuple[int, list[int]]] = []
        host_run: list[int] = []
        host_removed: list[int] = []
        added = 0
        host_cap = self.host_capacity
        no_tokens: list[int] = []  # token-free sequences share one empty list (never mutated)
        # pages [tail, end) are all absent: none of them can be a host eviction candidate, so
        # their host room is made in one batch, which evicts what page-by-page room would
        tail = end
        while tail > start and hashes[tail - 1] not in nodes:
            tail -= 1
        node: PageNode | None = parent
        for i in range(start, tail):
            h = hashes[i]
            node = nodes.get(h)
            if node is None:
                toks = list(tokens[i * ps : (i + 1) * ps]) if tokens else no_tokens
                node = PageNode(h, parent, toks, stamp, False, False)
                nodes[h] = node
                if parent is not None:
                    parent.children += 1
            node.last = stamp
            if not node.on_gpu:
                node.on_gpu = True
                added += 1
                if parent is not None:
                    parent.gpu_children += 1
                if not gpu_run:
                    gpu_runs.append((i, gpu_run))
                gpu_run.append(h)
            elif gpu_run:
                gpu_run = []
            if (
                host_cap > 0
                and not node.on_host
                and (self.host_used < host_cap or self._host_room(host_removed))
            ):
                node.on_host = True
                self.host_used += 1
                if not host_run:
                    host_runs.append((i, host_run))
                host_run.append(h)
            elif host_run:
                host_run = []
            parent = node
        if tail < end:
            n_host = 0
            if host_cap > 0:
                self._evict_host_pages((end - tail) - (host_cap - self.host_used), host_removed)
                n_host = max(min(end - tail, host_cap - self.host_used), 0)
                self.host_used += n_host
            host_end = tail + n_host  # as page by page: the first pages get the room there is
            if parent is not None:
                parent.children += 1
                parent.gpu_children += 1
            # a fresh chain: every page but the last has one child, on the GPU (this loop runs
            # once per page a run computes or loads, the simulator's hottest)
            for i in range(tail, end):
                h = hashes[i]
                toks = list(tokens[i * ps : (i + 1) * ps]) if tokens else no_tokens
                node = PageNode(h, parent, toks, stamp, True, i < host_end, 1)
                nodes[h] = node
                parent = node
            if node is not None:  # the chain's leaf
                node.children = node.gpu_children = 0
            added += end - tail
            if gpu_run:
                gpu_run.extend(hashes[tail:end])
            else:
                gpu_runs.append((tail, list(hashes[tail:end])))
            if n_host and host_run:
                host_run.extend(hashes[tail:host_end])
            elif n_host:
                host_runs.append((tail, list(hashes[tail:host_end])))
        self.gpu_used += added
        if added and node is not None:
            # only the last page can be a GPU leaf; the others just got a GPU child
            self._push(self._gpu_heap, node)
        events: list[KVCacheEvent] = []
        if host_removed:
            events.append(BlockRemoved(block_hashes=host_removed, medium=CPU_PINNED))
        events.extend(self._stored(r, hashes, GPU) for r in gpu_runs)
        events.extend(self._stored(r, hashes, CPU_PINNED) for r in host_runs)
        return node, added, events

    def _stored(
        self, run: tuple[int, list[int]], hashes: Sequence[int], medium: str
    ) -> BlockStored:
        first, run_hashes = run
        toks: list[int] = []
        if self.nodes[run_hashes[0]].tokens:  # token-free sequences have none to report
            for h in run_hashes:
                toks.extend(self.nodes[h].tokens)
        return BlockStored(
            block_hashes=list(run_hashes),
            parent_block_hash=hashes[first - 1] if first > 0 else None,
            token_ids=toks,
            block_size=self.page_size,
            lora_id=None,
            medium=medium,
        )

    def _host_room(self, removed: list[int]) -> bool:
        if self.host_used < self.host_capacity:
            return True
        self._evict_host_pages(1, removed)
        return self.host_used < self.host_capacity

    # ---- eviction -----------------------------------------------------------------------------

    def evict_gpu(self, n_pages: int) -> list[KVCacheEvent]:
        """Evict up to n_pages unlocked GPU leaves, least recently used first."""
        removed: list[int] = []
        heap = self._gpu_heap
        nodes = self.nodes
        nxt: PageNode | None = None
        while len(removed) < n_pages and (nxt is not None or heap):
            if nxt is not None:
                node, nxt = nxt, None
            else:
                last, _, node = heapq.heappop(heap)
                if not (node.alive and node.on_gpu and node.lock == 0 and node.gpu_children == 0):
                    continue
                if last != node.last:
                    self._push(heap, node)
                    continue
            node.on_gpu = False
            removed.append(node.hash)
            parent = node.parent
            if parent is not None:
                parent.gpu_children -= 1
                if parent.gpu_children == 0:
                    # walk up a chain directly while the parent is still the least recent
                    if parent.lock == 0 and (not heap or parent.last <= heap[0][0]):
                        nxt = parent
                    else:
                        self._push(heap, parent)
            if not node.on_host:  # as _remove, inlined: this loop runs once per evicted page
                node.alive = False
                del nodes[node.hash]
                if parent is not None:
                    parent.children -= 1
                    if parent.children == 0 and parent.on_host and not parent.on_gpu:
                        self._push(self._host_heap, parent)
            elif node.children == 0:
                self._push(self._host_heap, node)
        if nxt is not None:
            self._push(heap, nxt)
        self.gpu_used -= len(removed)
        events: list[KVCacheEvent] = []
        if removed:
            events.append(BlockRemoved(block_hashes=removed, medium=GPU))
        return events

    def evict_host(self, n_pages: int) -> list[KVCacheEvent]:
        removed: list[int] = []
        self._evict_host_pages(n_pages, removed)
        return [BlockRemoved(block_hashes=removed, medium=CPU_PINNED)] if removed else []

    def _evict_host_pages(self, n_pages: int, removed: list[int]) -> None:
        """Evict up to n_pages host LRU pages (off the GPU, childless) into removed."""
        heap = self._host_heap
        nodes = self.nodes
        while n_pages > 0 and heap:
            last, _, node = heapq.heappop(heap)
            if not (node.alive and node.on_host and not node.on_gpu and node.children == 0):
                continue
            if last != node.last:
                self._push(heap, node)
                continue
            node.on_host = False
            self.host_used -= 1
            node.alive = False
            del nodes[node.hash]
            removed.append(node.hash)
            n_pages -= 1
            parent = node.parent  # as _remove, inlined: this loop runs once per evicted page
            if parent is not None:
                parent.children -= 1
                if parent.children == 0 and parent.on_host and not parent.on_gpu:
                    self._push(heap, parent)

    def clear(self) -> list[KVCacheEvent]:
        for node in self.nodes.values():
            node.alive = False
        self.nodes.clear()
        self.gpu_used = 0
        self.host_used = 0
        self._gpu_heap.clear()
        self._host_heap.clear()
        return [AllBlocksCleared()]

    def _push(self, heap: list[_HeapEntry], node: PageNode) -> None:
        self._seq += 1
        heapq.heappush(heap, (node.last, self._seq, node))
