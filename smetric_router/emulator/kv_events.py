"""The emulated worker's KV-event encoder: SGLang 0.5.23's msgpack layout, built by hand.

Written from SGLang's own structs (sglang/srt/disaggregation/kv_events.py), not through the
router's decoding schema (smetric_router/core/kv_events.py), so that a mistake in either one shows
as a difference against SGLang's recorded bytes (tests/emulator/test_kv_encoding_recorded.py):

- a batch is `EventBatch(array_like=True)`: the array [ts (float64), events, attn_dp_rank];
- an event is a map tagged by "type" (msgspec `tag=True` writes the tag first), its fields in
  SGLang's declaration order, optional ones equal to None left out (`omit_defaults`):
  BlockStored {block_hashes, parent_block_hash, token_ids, block_size, lora_id[, medium]
  [, cache_salt][, session_id][, lora_name]}, BlockRemoved {block_hashes[, medium]},
  AllBlocksCleared {}. parent_block_hash and lora_id have no default, so None is written.

The emulator never sets cache_salt, session_id or lora_name. The engine's events (the
core.kv_events structs) are read here as plain data only: their own msgspec encoding is unused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from smetric_router.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent

_encoder = msgspec.msgpack.Encoder()


def event_map(ev: KVCacheEvent) -> dict[str, Any]:
    """One event as SGLang's tagged map, keys in SGLang's order."""
    out: dict[str, Any]
    if isinstance(ev, BlockStored):
        out = {
            "type": "BlockStored",
            "block_hashes": ev.block_hashes,
            "parent_block_hash": ev.parent_block_hash,
            "token_ids": ev.token_ids,
            "block_size": ev.block_size,
            "lora_id": ev.lora_id,
        }
    elif isinstance(ev, BlockRemoved):
        out = {"type": "BlockRemoved", "block_hashes": ev.block_hashes}
    elif isinstance(ev, AllBlocksCleared):
        return {"type": "AllBlocksCleared"}
    else:
        raise TypeError(f"not a KV-cache event SGLang 0.5.23 publishes: {ev!r}")
    if ev.medium is not None:
        out["medium"] = ev.medium
    return out


def encode_batch(events: Sequence[KVCacheEvent], ts: float, attn_dp_rank: int | None = 0) -> bytes:
    """A PUB payload: msgpack [ts, [event map, ...], attn_dp_rank]. SGLang's `EventBatch` is
    array_like without omit_defaults, so a None rank is written as nil, not left out."""
    return _encoder.encode([float(ts), [event_map(ev) for ev in events], attn_dp_rank])
