"""SGLang 0.5.23's KV-event wire schema (disaggregation/kv_events.py), written from its spec.

A batch is a msgpack array [ts, events, attn_dp_rank]; each event is a map tagged by "type".
Optional fields equal to None are omitted; parent_block_hash and lora_id are always present.
ZMQ frames are [topic, seq (8-byte big-endian), payload].

The router decodes with this schema (checked against recorded SGLang traffic in
tests/fixtures/kv_events). The structs double as plain event records for the engine model;
the emulated worker encodes them with its own encoder (emulator/kv_events.py), not this schema.
"""

from __future__ import annotations

import msgspec

GPU = "GPU"
CPU_PINNED = "CPU_PINNED"
# HiCache L3 storage (Mooncake): SGLang's StorageMedium.EXTERNAL, sent by the fork's L3 patch
# (patches/sglang-0.5.23-smetric-l3-events.patch), never by stock SGLang 0.5.23
EXTERNAL = "EXTERNAL"


class KVCacheEvent(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


AnyEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[AnyEvent]
    attn_dp_rank: int | None = None


_decoder = msgspec.msgpack.Decoder(KVEventBatch)


def decode_batch(payload: bytes) -> KVEventBatch:
    return _decoder.decode(payload)
