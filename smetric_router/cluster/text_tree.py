"""The `cache_aware` baseline's approximate cache view, as sglang-router keeps it: one radix tree of
raw request text (characters, not tokens) shared by all workers, each node tagged with the
workers ("tenants") it was routed to and when. It guesses what a worker caches from where the
router sent requests; it never sees the worker's real cache.

A worker's nodes are prefix-closed (insert tags the whole path, eviction removes that worker's
leaves first), so a match credits each worker with the depth of its deepest tagged node on the
path. Eviction is LRU per worker by a logical clock, run when a worker exceeds `max_size` chars
(sglang-router runs it on a timer instead; running it inline keeps the tree bounded at all times).
"""

from __future__ import annotations

import heapq
import itertools


class _Node:
    __slots__ = ("children", "parent", "tenants", "text")

    def __init__(self, text: str, parent: _Node | None) -> None:
        self.text = text
        self.parent = parent
        self.children: dict[str, _Node] = {}
        self.tenants: dict[str, int] = {}  # worker -> logical time of last insert through here


def _common_prefix(edge: str, text: str, start: int) -> int:
    """Length of the common prefix of `edge` and text[start:], using C-speed comparisons."""
    if text.startswith(edge, start):
        return len(edge)
    lo, hi = 0, min(len(edge), len(text) - start)  # answer in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if text.startswith(edge[:mid], start):
            lo = mid
        else:
            hi = mid - 1
    return lo


class TextTree:
    def __init__(self, max_size: int = 2**26, evict_to: float = 0.9) -> None:
        """max_size: chars per worker (sglang-router's --max-tree-size); eviction goes down to
        evict_to * max_size so that its O(worker's nodes) scan is paid rarely."""
        self.max_size = max_size
        self._target = int(max_size * evict_to)
        self._root = _Node("", None)
        self._clock = itertools.count(1)
        self._size: dict[str, int] = {}
        self._nodes: dict[str, set[_Node]] = {}

    def size(self, worker: str) -> int:
        return self._size.get(worker, 0)

    def workers(self) -> list[str]:
        return list(self._size)

    def match(self, text: str) -> dict[str, int]:
        """Matched leading chars of `text` per known worker."""
        out = dict.fromkeys(self._size, 0)
        node, i = self._root, 0
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                break
            k = _common_prefix(child.text, text, i)
            for w in child.tenants:
                out[w] = i + k
            if k < len(child.text):
                break
            node, i = child, i + k
        return out

    def insert(self, text: str, worker: str) -> None:
        now = next(self._clock)
        self._size.setdefault(worker, 0)
        nodes = self._nodes.setdefault(worker, set())
        node, i = self._root, 0
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                child = _Node(text[i:], node)
                node.children[text[i]] = child
                k = len(child.text)
            else:
                k = _common_prefix(child.text, text, i)
                if k < len(child.text):
                    child = self._split(child, k)
            if worker not in child.tenants:
                self._size[worker] += len(child.text)
                nodes.add(child)
            child.tenants[worker] = now
            node, i = child, i + k
        if self._size[worker] > self.max_size:
            self._evict(worker, self._target)

    def remove_worker(self, worker: str) -> None:
        for node in self._nodes.pop(worker, set()):
            del node.tenants[worker]
            self._prune(node)
        self._size.pop(worker, None)

    def _split(self, node: _Node, k: int) -> _Node:
        """Cut node's edge after k chars; returns the new upper part (same tenants)."""
        assert node.parent is not None
        upper = _Node(node.text[:k], node.parent)
        upper.tenants = dict(node.tenants)
        node.parent.children[upper.text[0]] = upper
        node.text = node.text[k:]
        node.parent = upper
        upper.children[node.text[0]] = node
        for w in upper.tenants:
            self._nodes[w].add(upper)
        return upper

    def _evict(self, worker: str, target: int) -> None:
        """Drop the worker's least recently inserted leaves until it holds <= target chars."""
        nodes = self._nodes[worker]
        order = itertools.count()  # tie-break: heap entries must never compare nodes
        heap = [
            (n.tenants[worker], next(order), n)
            for n in nodes
            if not any(worker in c.tenants for c in n.children.values())
        ]
        heapq.heapify(heap)
        while heap and self._size[worker] > target:
            _, _, node = heapq.heappop(heap)
            del node.tenants[worker]
            nodes.discard(node)
            self._size[worker] -= len(node.text)
            parent = node.parent
            self._prune(node)
            if (
                parent is not None
                and worker in parent.tenants
                and not any(worker in c.tenants for c in parent.children.values())
            ):
                heapq.heappush(heap, (parent.tenants[worker], next(order), parent))

    @staticmethod
    def _prune(node: _Node) -> None:
        """Unlink untenanted leaves, walking up."""
        while node.parent is not None and not node.tenants and not node.children:
            del node.parent.children[node.text[0]]
            node = node.parent
