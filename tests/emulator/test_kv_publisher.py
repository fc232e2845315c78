from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import zmq

from smetric_router.core.kv_events import CPU_PINNED, AllBlocksCleared, BlockRemoved, BlockStored
from smetric_router.emulator.kv_publisher import KvEventPublisher

DEADLINE_S = 5.0


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    c: zmq.Context[Any] = zmq.Context()
    yield c
    c.destroy(linger=0)


def recv(sock: zmq.Socket[Any], timeout_s: float = DEADLINE_S) -> list[bytes]:
    assert sock.poll(int(timeout_s * 1000)), "nothing received before the deadline"
    frames: list[bytes] = sock.recv_multipart()
    return frames


def joined_sub(ctx: zmq.Context[Any], pub: KvEventPublisher, topic: bytes) -> tuple[Any, int]:
    """A SUB socket that has joined; returns it with the next seq it will see."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.connect(pub.endpoint)
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        probe = pub.publish([AllBlocksCleared()])
        if sub.poll(20):
            # On a busy machine the probe seen first can be an earlier one that outlived its
            # poll; once one arrived the SUB has joined, and every later probe follows in order.
            seen = int.from_bytes(sub.recv_multipart()[1], "big")
            assert seen <= probe
            while seen < probe:
                seen = int.from_bytes(recv(sub)[1], "big")
            return sub, probe + 1
    raise AssertionError("SUB never joined")


def test_wire_frames_decode_with_plain_msgpack(ctx: zmq.Context[Any]) -> None:
    pub = KvEventPublisher("tcp://127.0.0.1:*", topic="kv")
    try:
        sub, nxt = joined_sub(ctx, pub, b"kv")
        stored = BlockStored(
            block_hashes=[-5, 7],
            parent_block_hash=None,
            token_ids=[1, 2, 3, 4],
            block_size=2,
            lora_id=None,
            medium="GPU",
        )
        assert pub.publish([stored, BlockRemoved(block_hashes=[9], medium=CPU_PINNED)], 1.5) == nxt
        assert pub.publish([AllBlocksCleared()], 2.0) == nxt + 1
        topic, seq, payload = recv(sub)
        assert (topic, len(seq), int.from_bytes(seq, "big")) == (b"kv", 8, nxt)
        assert msgspec.msgpack.decode(payload) == [
            1.5,
            [
                {
                    "type": "BlockStored",
                    "block_hashes": [-5, 7],
                    "parent_block_hash": None,
                    "token_ids": [1, 2, 3, 4],
                    "block_size": 2,
                    "lora_id": None,
                    "medium": "GPU",
                },
                {"type": "BlockRemoved", "block_hashes": [9], "medium": "CPU_PINNED"},
            ],
            0,
        ]
        topic, seq, payload = recv(sub)
        assert int.from_bytes(seq, "big") == nxt + 1
        assert msgspec.msgpack.decode(payload) == [2.0, [{"type": "AllBlocksCleared"}], 0]
    finally:
        pub.close()


def replay(ctx: zmq.Context[Any], endpoint: str, start: int) -> list[tuple[bytes, int, bytes]]:
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    out: list[tuple[bytes, int, bytes]] = []
    while True:
        frames = recv(dealer)
        assert len(frames) == 4 and frames[0] == b""
        seq = int.from_bytes(frames[2], "big", signed=True)
        if seq == -1:
            assert frames[3] == b""
            dealer.close(linger=0)
            return out
        out.append((frames[1], seq, frames[3]))


def test_replay_serves_buffer_from_start_seq_and_rolls_over(ctx: zmq.Context[Any]) -> None:
    pub = KvEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", topic="t", buffer_steps=3)
    try:
        assert pub.replay_endpoint is not None
        seqs = [pub.publish([AllBlocksCleared()], float(i)) for i in range(5)]
        assert seqs == [0, 1, 2, 3, 4]
        got = replay(ctx, pub.replay_endpoint, 0)
        assert [(t, s) for t, s, _ in got] == [(b"t", 2), (b"t", 3), (b"t", 4)]
        assert msgspec.msgpack.decode(got[0][2])[0] == 2.0
        assert [s for _, s, _ in replay(ctx, pub.replay_endpoint, 4)] == [4]
        assert replay(ctx, pub.replay_endpoint, 5) == []
    finally:
        pub.close()


def test_dropped_seq_is_missing_on_pub_but_replayable(ctx: zmq.Context[Any]) -> None:
    pub = KvEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    try:
        assert pub.replay_endpoint is not None
        sub, nxt = joined_sub(ctx, pub, b"")
        pub.drop_seq(nxt)
        pub.drop_seq(nxt + 1, replayable=False)
        for _ in range(3):
            pub.publish([AllBlocksCleared()])
        assert int.from_bytes(recv(sub)[1], "big") == nxt + 2
        assert [s for _, s, _ in replay(ctx, pub.replay_endpoint, nxt)] == [nxt, nxt + 2]
    finally:
        pub.close()


def test_publish_after_close_is_refused() -> None:
    pub = KvEventPublisher("tcp://127.0.0.1:*")
    pub.publish([AllBlocksCleared()])
    pub.close()
    with pytest.raises(RuntimeError):
        pub.publish([AllBlocksCleared()])
