"""KV events built for tests."""

from __future__ import annotations

from smetric_router.core.kv_events import GPU, BlockStored

PAGE = 16


def stored(
    hashes: list[int], parent: int | None, medium: str | None = GPU, page: int = PAGE
) -> BlockStored:
    """Pages `hashes` stored in `medium`, chained after `parent` (None: from the root), one full
    page of placeholder token ids each."""
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=list(range(page * len(hashes))),
        block_size=page,
        lora_id=None,
        medium=medium,
    )
