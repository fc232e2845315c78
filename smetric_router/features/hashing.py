"""SGLang's KV page hashes, recomputed from token ids (sglang 0.5.23, mem_cache/utils.py).

page_i = SHA256(digest_{i-1} || tokens of page i as little-endian uint32), digest_{-1} = b"";
only full pages count (the radix tree matches page-aligned prefixes). A KV event's block hash is
the first 8 bytes of the digest read as a big-endian signed int64.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from hashlib import sha256

_U32 = next(code for code in ("I", "L") if array(code).itemsize == 4)


def as_u32(token_ids: Sequence[int]) -> array[int]:
    """token_ids as a native uint32 array (no copy when it already is one)."""
    if isinstance(token_ids, array) and token_ids.typecode == _U32:
        return token_ids
    try:
        return array(_U32, token_ids)
    except OverflowError:
        # SGLang tags wider ids with a 64-bit encoding; no real vocabulary needs it.
        raise ValueError("token ids must fit in uint32") from None


def pack_tokens(token_ids: Sequence[int]) -> bytes:
    """Token ids as little-endian uint32 bytes."""
    packed = as_u32(token_ids)
    if sys.byteorder == "big":
        packed = array(_U32, packed)
        packed.byteswap()
    return packed.tobytes()


def block_hash(digest: bytes) -> int:
    """The KV-event block hash of a page digest."""
    return int.from_bytes(digest[:8], "big", signed=True)


def page_digests(token_ids: Sequence[int], page_size: int, prev_digest: bytes = b"") -> list[bytes]:
    """Digests of the full pages of token_ids, chained after prev_digest (a trailing partial
    page is ignored)."""
    if page_size <= 0:
        raise ValueError(f"page_size must be > 0, got {page_size}")
    n_full = len(token_ids) // page_size
    buf = pack_tokens(token_ids[: n_full * page_size])
    step = 4 * page_size
    out: list[bytes] = []
    digest = prev_digest
    for off in range(0, len(buf), step):
        digest = sha256(digest + buf[off : off + step]).digest()
        out.append(digest)
    return out


def page_hashes(token_ids: Sequence[int], page_size: int, prev_digest: bytes = b"") -> list[int]:
    """KV-event block hashes of the full pages of token_ids, chained after prev_digest."""
    return [block_hash(d) for d in page_digests(token_ids, page_size, prev_digest)]


@dataclass(frozen=True, slots=True)
class ChainState:
    """Where a page-hash chain stands after some tokens: the last full page's digest and the
    tokens of the trailing partial page, so that more tokens can extend it without rehashing."""

    page_size: int
    digest: bytes = b""
    tail: tuple[int, ...] = ()
    pages: int = 0

    @property
    def tokens(self) -> int:
        return self.pages * self.page_size + len(self.tail)

    def extend(self, token_ids: Sequence[int]) -> tuple[ChainState, list[int]]:
        """The state after token_ids and the block hashes of the pages they complete."""
        if self.tail:
            joined: Sequence[int] = array(_U32, self.tail) + as_u32(token_ids)
        else:
            joined = token_ids
        digests = page_digests(joined, self.page_size, self.digest)
        used = len(digests) * self.page_size
        state = ChainState(
            self.page_size,
            digests[-1] if digests else self.digest,
            tuple(joined[used:]),
            self.pages + len(digests),
        )
        return state, [block_hash(d) for d in digests]
