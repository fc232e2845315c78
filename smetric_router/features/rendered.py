"""A rendered prompt with its token ids and page hashes, built from an earlier one it shares a
beginning with: only the text after the last cut point (an added-token end, see
prompt_tokenizer) before the first changed character is tokenized, and only the pages from
there on are hashed. Exact whatever the earlier prompt is; the more it shares, the less work.
"""

from __future__ import annotations

import bisect
from array import array
from dataclasses import dataclass

from smetric_router.features.hashing import as_u32, block_hash, page_digests
from smetric_router.features.prompt_tokenizer import PromptTokenizer

_DIGEST = 32
_COMPARE_CHUNK = 1 << 14


@dataclass(frozen=True, slots=True)
class Rendered:
    text: str
    ids: array[int]  # uint32 token ids of text
    cut_ends: array[int]  # characters where ids may be cut, ascending (0 is always one)
    cut_tokens: array[int]  # ids before each of them
    digests: bytes  # SHA-256 chain digest of each full page, 32 bytes each
    hashes: array[int]  # signed int64 block hash of each full page
    page_size: int

    @property
    def size(self) -> int:
        """Approximate bytes held."""
        return (
            len(self.text)
            + 4 * len(self.ids)
            + 16 * len(self.cut_ends)
            + len(self.digests)
            + 8 * len(self.hashes)
        )

    def tokens_through(self, chars: int) -> int:
        """Ids of text[:e] for the last cut point e <= chars."""
        at = bisect.bisect_right(self.cut_ends, chars) - 1
        return self.cut_tokens[at]

    def cut_through(self, chars: int) -> tuple[int, int, int]:
        """(index, end, ids) of the last cut point at or before chars."""
        at = bisect.bisect_right(self.cut_ends, chars) - 1
        return at, self.cut_ends[at], self.cut_tokens[at]


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of a and b."""
    if b.startswith(a):
        return len(a)
    if a.startswith(b):
        return len(b)
    lo, n = 0, min(len(a), len(b))
    step = _COMPARE_CHUNK
    while lo + step <= n and a[lo : lo + step] == b[lo : lo + step]:
        lo += step
    hi = min(lo + step, n)
    # a[:lo] == b[:lo] and they differ before hi: bisect
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def render_from(
    tokenizer: PromptTokenizer, text: str, page_size: int, base: Rendered | None
) -> tuple[Rendered, int]:
    """text's ids and page hashes, reusing what base's text shares with it; and the number of
    leading characters they share."""
    if base is None or base.page_size != page_size:
        shared = at = start = kept = 0
        base_ids: array[int] = as_u32(())
    else:
        shared = common_prefix(base.text, text)
        if shared == len(base.text) == len(text):
            return base, shared
        at, start, kept = base.cut_through(shared)
        base_ids = base.ids
    tail = tokenizer.encode_chat(text[start:])
    ids = base_ids[:kept]
    ids.extend(as_u32(tail))
    cuts = tokenizer.cut_points(text, start, tail, kept)
    if base is not None and base.page_size == page_size:
        cut_ends = base.cut_ends[: at + 1]
        cut_tokens = base.cut_tokens[: at + 1]
    else:
        cut_ends, cut_tokens = array("q", [0]), array("q", [0])
    if cuts is not None:
        cut_ends.extend(cuts[0])
        cut_tokens.extend(cuts[1])
    pages = kept // page_size
    digests = base.digests[: pages * _DIGEST] if base is not None and pages else b""
    hashes = base.hashes[:pages] if base is not None and pages else array("q")
    new = page_digests(ids[pages * page_size :], page_size, digests[-_DIGEST:])
    hashes.extend(block_hash(d) for d in new)
    rendered = Rendered(text, ids, cut_ends, cut_tokens, digests + b"".join(new), hashes, page_size)
    return rendered, shared


def truncated(rendered: Rendered, chars: int) -> Rendered:
    """rendered cut at its last cut point at or before chars (a valid base for render_from)."""
    if chars >= len(rendered.text):
        return rendered
    at, end, kept = rendered.cut_through(chars)
    pages = kept // rendered.page_size
    return Rendered(
        rendered.text[:end],
        rendered.ids[:kept],
        rendered.cut_ends[: at + 1],
        rendered.cut_tokens[: at + 1],
        rendered.digests[: pages * _DIGEST],
        rendered.hashes[:pages],
        rendered.page_size,
    )
