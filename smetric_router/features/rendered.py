"""A rendered prompt with its token ids and page hashes, built from an earlier one it shares a
beginning with: only the text after the last cut point (an added-token end, see
prompt_tokenizer) before the first changed character is tokenized, and only the pages from
there on are hashed. Exact whatever the earlier prompt is; the more it shares, the less work.

A prompt is stored as a chain: a node holds the text, ids, cut points and page digests from its
start (a cut point of its parent's prompt) on, so a follow-up costs memory and copying in
proportion to what it adds, not to its history. Chains longer than MAX_DEPTH are flattened.
"""

from __future__ import annotations

import bisect
import sys
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

from smetric_router.features.budget import UNLIMITED, Budget
from smetric_router.features.hashing import as_u32, block_hash, page_digests
from smetric_router.features.prompt_tokenizer import PromptTokenizer

_DIGEST = 32
MAX_DEPTH = 48


@dataclass(frozen=True, slots=True, eq=False)
class Rendered:
    """One node: the prompt is the parent's prompt up to `start` characters (`first` ids), then
    `tail`. The node's own cut points lie in (start, length]; `start` is one as well."""

    parent: Rendered | None
    start: int
    first: int
    tail: str
    ids: array[int]  # uint32 ids of tail
    cut_ends: array[int]  # absolute character positions, ascending
    cut_tokens: array[int]  # ids before each of them
    digests: bytes  # chain digests of the full pages from page first // page_size on
    hashes: array[int]  # their block hashes (signed int64)
    page_size: int
    depth: int = 0
    total: int = field(default=0)  # bytes held by this node and its ancestors

    @property
    def length(self) -> int:
        return self.start + len(self.tail)

    @property
    def n_ids(self) -> int:
        return self.first + len(self.ids)

    @property
    def own_bytes(self) -> int:
        return (
            sys.getsizeof(self.tail)
            + 4 * len(self.ids)
            + 16 * len(self.cut_ends)
            + len(self.digests)
            + 8 * len(self.hashes)
        )

    def chain(self) -> list[Rendered]:
        """The nodes from the root to this one."""
        nodes = []
        node: Rendered | None = self
        while node is not None:
            nodes.append(node)
            node = node.parent
        nodes.reverse()
        return nodes

    def cut_through(self, chars: int) -> tuple[Rendered, int, int]:
        """(node holding it, end, ids before it) of the last cut point at or before chars."""
        node = self
        while node.parent is not None and chars < node.start:
            node = node.parent
        at = bisect.bisect_right(node.cut_ends, chars) - 1
        if at >= 0:
            return node, node.cut_ends[at], node.cut_tokens[at]
        return node, node.start, node.first

    def tokens_through(self, chars: int) -> int:
        """Ids of the prompt up to its last cut point at or before chars."""
        return self.cut_through(chars)[2]

    def _segments(self) -> Iterator[tuple[Rendered, int, int]]:
        """(node, its part of the prompt's characters end, its part of the ids' end), root
        first: each node's region of the prompt runs from its start to the next one's."""
        nodes = self.chain()
        for node, after in zip(nodes, [*nodes[1:], None], strict=True):
            if after is None:
                yield node, node.length, node.n_ids
            else:
                yield node, after.start, after.first

    def text(self) -> str:
        return "".join(node.tail[: end - node.start] for node, end, _ in self._segments())

    def chars(self, start: int, end: int) -> str:
        """text()[start:end], copied out of the nodes that hold it."""
        pieces = []
        for node, stop, _ in self._segments():
            if stop > start and node.start < end:
                lo = max(start, node.start) - node.start
                pieces.append(node.tail[lo : min(end, stop) - node.start])
        return "".join(pieces)

    def token_ids(self) -> array[int]:
        out = as_u32(())
        for node, _, end in self._segments():
            out.extend(node.ids[: end - node.first])
        return out

    def page_hashes(self) -> array[int]:
        out: array[int] = array("q")
        for node, _, end in self._segments():
            first_page = node.first // node.page_size
            out.extend(node.hashes[: end // node.page_size - first_page])
        return out

    def page_digests(self) -> bytes:
        """The full pages' chain digests, concatenated (32 bytes each), as page_hashes()."""
        out = []
        for node, _, end in self._segments():
            first_page = node.first // node.page_size
            out.append(node.digests[: (end // node.page_size - first_page) * _DIGEST])
        return b"".join(out)

    def _digest_of_page(self, page: int) -> bytes:
        node = self
        while node.parent is not None and page < node.first // node.page_size:
            node = node.parent
        offset = (page - node.first // node.page_size) * _DIGEST
        return node.digests[offset : offset + _DIGEST]

    def _ids_between(self, lo: int, hi: int) -> array[int]:
        """The prompt's ids [lo, hi), hi <= this node's first + len(ids)."""
        pieces = []
        node: Rendered | None = self
        while node is not None and hi > lo:
            if node.first <= lo:
                pieces.append(node.ids[lo - node.first : hi - node.first])
                break
            if hi > node.first:
                pieces.append(node.ids[: hi - node.first])
                hi = node.first
            node = node.parent
        out = as_u32(())
        for piece in reversed(pieces):
            out.extend(piece)
        return out


def common_prefix(a: str, b: str, a_start: int = 0) -> int:
    """Length of the longest common prefix of a[a_start:] and b."""
    if a.startswith(b, a_start):
        return len(b)
    if not a_start and b.startswith(a):  # an est_hit rendering that is a prefix of the prompt
        return len(a)
    n = min(len(a) - a_start, len(b))
    lo, hi = 0, n
    while lo < hi:  # a[a_start:a_start+lo] == b[:lo]; they differ before hi
        mid = (lo + hi + 1) // 2
        if a.startswith(b[lo:mid], a_start + lo):
            lo = mid
        else:
            hi = mid - 1
    return lo


def shared_chars(base: Rendered, text: str) -> int:
    """Length of the longest common prefix of base's prompt and text."""
    for node, end, _ in base._segments():
        size = end - node.start
        if size == len(node.tail):
            if text.startswith(node.tail, node.start):
                continue
        elif text.startswith(node.tail[:size], node.start):
            continue
        return node.start + common_prefix(text, node.tail[:size], node.start)
    return base.length


def _root(tokenizer: PromptTokenizer, text: str, page_size: int, budget: Budget) -> Rendered:
    ids = as_u32(tokenizer.encode_chat(text, budget))
    cuts = tokenizer.cut_points(text, 0, ids, 0) or (array("q"), array("q"))
    digests = page_digests(ids, page_size)
    return _node(None, 0, 0, text, ids, cuts, digests, page_size)


def _node(
    parent: Rendered | None,
    start: int,
    first: int,
    tail: str,
    ids: array[int],
    cuts: tuple[array[int], array[int]],
    digests: list[bytes],
    page_size: int,
) -> Rendered:
    node = Rendered(
        parent,
        start,
        first,
        tail,
        ids,
        cuts[0],
        cuts[1],
        b"".join(digests),
        array("q", (block_hash(d) for d in digests)),
        page_size,
        0 if parent is None else parent.depth + 1,
    )
    total = node.own_bytes + (0 if parent is None else parent.total)
    object.__setattr__(node, "total", total)
    return node


def render_from(
    tokenizer: PromptTokenizer,
    text: str,
    page_size: int,
    base: Rendered | None,
    budget: Budget = UNLIMITED,
) -> tuple[Rendered, int]:
    """text's ids and page hashes, reusing what base's prompt shares with it; and the number of
    leading characters they share. The tokenizing of what is new is held to budget."""
    if base is None or base.page_size != page_size:
        return _root(tokenizer, text, page_size, budget), 0
    shared = shared_chars(base, text)
    if shared == base.length == len(text):
        return base, shared
    node, start, kept = base.cut_through(shared)
    while node.parent is not None and start == node.start:
        node = node.parent  # nothing of this node's own text is kept
    tail = as_u32(tokenizer.encode_chat(text[start:], budget, kept))
    cuts = tokenizer.cut_points(text, start, tail, kept) or (array("q"), array("q"))
    page = kept // page_size
    partial = node._ids_between(page * page_size, kept)
    partial.extend(tail)
    previous = node._digest_of_page(page - 1) if page else b""
    digests = page_digests(partial, page_size, previous)
    child = _node(node, start, kept, text[start:], tail, cuts, digests, page_size)
    if child.depth > MAX_DEPTH:
        child = flattened(child)
    return child, shared


def flattened(node: Rendered) -> Rendered:
    """The same prompt as one root node."""
    text = node.text()
    cut_ends, cut_tokens = array("q"), array("q")
    digests = []
    for n, end, id_end in node._segments():
        keep = bisect.bisect_right(n.cut_ends, end)
        cut_ends.extend(n.cut_ends[:keep])
        cut_tokens.extend(n.cut_tokens[:keep])
        first_page = n.first // n.page_size
        pages = (id_end // n.page_size if n is not node else n.n_ids // n.page_size) - first_page
        digests += [n.digests[i * _DIGEST : (i + 1) * _DIGEST] for i in range(max(0, pages))]
    flat = _node(None, 0, 0, text, node.token_ids(), (cut_ends, cut_tokens), [], node.page_size)
    object.__setattr__(flat, "digests", b"".join(digests))
    object.__setattr__(flat, "hashes", node.page_hashes())
    object.__setattr__(flat, "total", flat.own_bytes)
    return flat


def truncated(rendered: Rendered, chars: int) -> Rendered:
    """rendered's prompt cut at its last cut point at or before chars, as one root node (a
    valid base for render_from)."""
    _, end, kept = rendered.cut_through(chars)
    if end == rendered.length and rendered.parent is None:
        return rendered
    flat = rendered if rendered.parent is None else flattened(rendered)
    at = bisect.bisect_right(flat.cut_ends, end)
    pages = kept // flat.page_size
    out = Rendered(
        None,
        0,
        0,
        flat.tail[:end],
        flat.ids[:kept],
        flat.cut_ends[:at],
        flat.cut_tokens[:at],
        flat.digests[: pages * _DIGEST],
        flat.hashes[:pages],
        flat.page_size,
    )
    object.__setattr__(out, "total", out.own_bytes)
    return out
