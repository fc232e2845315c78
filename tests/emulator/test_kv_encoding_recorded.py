"""The emulator's KV-event encoder and publisher produce real SGLang 0.5.23's bytes.

Each recorded batch (tests/fixtures/kv_events) is read with a schemaless msgpack reader, turned
into the engine's event records and encoded again by the emulator: payloads, live frames and
replay answers must equal what the real worker sent, byte for byte (the recorded ts is reused;
everything else is deterministic).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import zmq

from smetric_router.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from smetric_router.emulator.kv_events import encode_batch, event_map
from smetric_router.emulator.kv_publisher import KvEventPublisher
from smetric_router.engine.api import EngineConfig, EngineRequest
from smetric_router.engine.engine import Engine
from tests.fixtures.kv_events import Message, load

REC = load()
BATCHES = REC.replay(1)[:-1]  # seq 0..31: every batch the worker published


def records(payload: bytes) -> tuple[float, list[KVCacheEvent], Any]:
    """A recorded payload as (ts, the engine's event records, dp rank), read without a schema."""
    ts, events, rank = msgspec.msgpack.decode(payload)
    out: list[KVCacheEvent] = []
    for e in events:
        kind = e.pop("type")
        if kind == "BlockStored":
            out.append(BlockStored(**e))
        elif kind == "BlockRemoved":
            out.append(BlockRemoved(**e))
        else:
            assert kind == "AllBlocksCleared" and not e
            out.append(AllBlocksCleared())
    return ts, out, rank


@pytest.mark.parametrize("m", BATCHES, ids=lambda m: f"seq{m.seq}")
def test_payload_equals_sglangs_bytes(m: Message) -> None:
    ts, events, rank = records(m.payload)
    assert rank == 0
    assert encode_batch(events, ts) == m.payload


def test_every_event_kind_and_medium_was_compared() -> None:
    kinds = {
        (type(ev).__name__, getattr(ev, "medium", None))
        for m in BATCHES
        for ev in records(m.payload)[1]
    }
    assert kinds == {
        ("AllBlocksCleared", None),
        ("BlockStored", "GPU"), ("BlockStored", "CPU_PINNED"),
        ("BlockRemoved", "GPU"), ("BlockRemoved", "CPU_PINNED"),
    }  # fmt: skip


def test_layout_details_sglang_fixes() -> None:
    """What the byte comparison pins, spelled out: the tag first, SGLang's key order,
    parent_block_hash and lora_id written as nil, a None medium left out, a None rank kept."""
    stored = BlockStored(block_hashes=[-1], parent_block_hash=None, token_ids=[5], block_size=1,
                         lora_id=None)  # fmt: skip
    assert list(event_map(stored)) == [
        "type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
    ]  # fmt: skip
    assert event_map(BlockRemoved(block_hashes=[3], medium="GPU")) == {
        "type": "BlockRemoved", "block_hashes": [3], "medium": "GPU",
    }  # fmt: skip
    assert msgspec.msgpack.decode(encode_batch([AllBlocksCleared()], 2.0, None)) == [
        2.0, [{"type": "AllBlocksCleared"}], None,
    ]  # fmt: skip


def test_engine_emits_sglangs_events_until_the_first_eviction() -> None:
    """The engine the emulator runs, given the recorded worker's pool sizes and requests, emits
    SGLang's events (hashes, parents, token ids, media, one store per request and tier) up to
    the first eviction. Later they part: SGLang evicts more than a request needs (48 of 64 device
    pages kept after the fills, the engine 63) and SGLang's probe refreshed host-only prefixes
    (the Rust tree core's touch), so different pages go."""
    device = REC.metadata["server_args"]["max_total_num_tokens"]
    host = 2 * device + REC.page_size  # --hicache-ratio 2 plus SGLang's padding page
    config = EngineConfig(page_size=REC.page_size, gpu_kv_tokens=device, host_kv_tokens=host)
    engine = Engine(config)
    emitted: list[KVCacheEvent] = []
    insert = REC.phases[0]
    for name in ["startup_0", *(r["prompt"] for r in insert.requests)]:  # SGLang's warm-up first
        engine.add_request(EngineRequest(name, REC.prompts[name], [7]))
        while engine.has_work():
            emitted += engine.step().kv_events
        emitted += engine.drain_events()
    recorded = [
        ev for m in BATCHES[1 : insert.last_seq + 1] for ev in msgspec.msgpack.decode(m.payload)[1]
    ]
    assert len(recorded) == 12
    assert [event_map(ev) for ev in emitted] == recorded


# --- frames and replay through the emulator's publisher -------------------------------------


@pytest.fixture
def publisher() -> Iterator[KvEventPublisher]:
    pub = KvEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    yield pub
    pub.close()


def _recv_all(sock: zmq.Socket[bytes], until_seq: int, timeout_s: float = 5.0) -> list[list[bytes]]:
    out: list[list[bytes]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sock.poll(50):
            out.append(sock.recv_multipart())
            if int.from_bytes(out[-1][-2], "big", signed=True) == until_seq:
                return out
    raise AssertionError(f"seq {until_seq} never arrived ({len(out)} messages)")


def test_live_frames_and_replay_equal_sglangs(publisher: KvEventPublisher) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(publisher.endpoint)
    dealer = ctx.socket(zmq.DEALER)
    assert publisher.replay_endpoint is not None
    dealer.connect(publisher.replay_endpoint)
    try:
        time.sleep(0.3)  # a SUB joins asynchronously; the recorder's SUB missed seq 0-1 too
        for m in BATCHES:
            ts, events, _ = records(m.payload)
            assert publisher.publish(events, ts) == m.seq
        live = _recv_all(sub, BATCHES[-1].seq)
        recorded_live = {m.seq: m.frames for m in REC.sub}
        got = {int.from_bytes(f[1], "big"): tuple(f) for f in live}
        assert set(recorded_live) <= set(got)  # seq 2..31, what the recorder's SUB saw
        for seq, frames in got.items():
            assert frames == (BATCHES[seq].topic, BATCHES[seq].frames[-2], BATCHES[seq].payload)
        for seq, frames in recorded_live.items():
            assert got[seq] == frames

        dealer.send_multipart([b"", (0).to_bytes(8, "big")])  # what the recorder sent
        answer = _recv_all(dealer, -1)
        assert [tuple(f) for f in answer] == [m.frames for m in REC.replay(1)]
    finally:
        sub.close(0)
        dealer.close(0)
        ctx.term()
