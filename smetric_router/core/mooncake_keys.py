"""SGLang 0.5.23's Mooncake object keys (mem_cache/storage/mooncake_store: MooncakeStore, MHA,
no PP, no extra_backend_tag): `{model}_{page sha256 chain digest hex}_{tp rank}_k` and `_v`, the
model being the served model name with '/' turned into '-'. The emulated workers write under them
and the router's L3 view asks for them, so both see exactly what real workers write."""

from __future__ import annotations

DIGEST = 32  # bytes of a page's chain digest


def key_prefix(served_model_name: str) -> str:
    return served_model_name.replace("/", "-")


def page_keys(prefix: str, digest: bytes, tp_rank: int = 0) -> tuple[str, str]:
    """One page's K and V object keys."""
    stem = f"{prefix}_{digest.hex()}_{tp_rank}"
    return f"{stem}_k", f"{stem}_v"


def page_stems(prefix: str, digests: bytes, tp_rank: int = 0) -> list[str]:
    """Each full page's key without its `_k`/`_v` suffix, in page order (digests concatenated)."""
    # one hex() over all pages, then slices: a router asks for every page of every prompt
    full = len(digests) // DIGEST * DIGEST
    text = digests[:full].hex()
    width = 2 * DIGEST
    return [f"{prefix}_{text[off : off + width]}_{tp_rank}" for off in range(0, len(text), width)]
