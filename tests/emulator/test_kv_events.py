"""KV events reach a ZMQ SUB socket in SGLang's wire format with SGLang's page hashes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import zmq
import zmq.asyncio

from smetric_router.core.kv_events import AllBlocksCleared, BlockStored, decode_batch
from smetric_router.features.hashing import page_hashes
from tests.emulator.conftest import MODEL, PAGE, Worker


@pytest.fixture
async def sub(worker: Worker) -> AsyncIterator[zmq.asyncio.Socket]:
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(f"tcp://127.0.0.1:{worker.config.kv_events_port}")
    # A SUB socket joins asynchronously: send fresh one-page prompts until a batch arrives.
    n = 0
    while not await sock.poll(50):
        n += 1
        assert n < 200, "no KV events from the worker"
        body = {"input_ids": [90_000 + n] * PAGE, "sampling_params": {"max_new_tokens": 1}}
        await worker.post("/generate", body)
    # Batches of the probes may still be in flight: send a marker and drain up to its batch,
    # so that each test reads only the events it caused.
    marker = 89_999
    await worker.post(
        "/generate", {"input_ids": [marker] * PAGE, "sampling_params": {"max_new_tokens": 1}}
    )
    while True:
        assert await sock.poll(5000), "the marker's KV events never arrived"
        events = decode_batch((await sock.recv_multipart())[2]).events
        if any(isinstance(e, BlockStored) and e.token_ids[:1] == [marker] for e in events):
            break
    yield sock
    sock.close(0)
    ctx.term()


async def _events(sock: zmq.asyncio.Socket, until: int = 1) -> list[object]:
    """Events of every batch that arrives within a short quiet period after `until` batches."""
    out: list[object] = []
    got = 0
    while await sock.poll(2000 if got < until else 100):
        topic, seq, payload = await sock.recv_multipart()
        assert topic == b"" and len(seq) == 8
        out += decode_batch(payload).events
        got += 1
    return out


async def test_block_hashes_equal_sglang_page_hashes(
    worker: Worker, sub: zmq.asyncio.Socket
) -> None:
    messages = [{"role": "user", "content": "hash these pages please " * 12}]
    prompt = worker.codec.render_messages(messages, add_generation_prompt=True)
    expected = page_hashes(prompt, PAGE)
    assert len(expected) >= 3
    body = {"model": MODEL, "messages": messages, "max_tokens": 3}
    status, _ = await worker.post("/v1/chat/completions", body)
    assert status == 200
    stored = [e for e in await _events(sub) if isinstance(e, BlockStored)]
    hashes = [h for e in stored for h in e.block_hashes]
    assert hashes[: len(expected)] == expected
    first = stored[0]
    assert first.parent_block_hash is None and first.block_size == PAGE
    assert first.token_ids[: len(expected) * PAGE] == prompt[: len(expected) * PAGE]


async def test_flush_publishes_all_blocks_cleared(worker: Worker, sub: zmq.asyncio.Socket) -> None:
    async with worker.http.post(worker.url + "/flush_cache") as r:
        assert r.status == 200
    events = await _events(sub)
    assert any(isinstance(e, AllBlocksCleared) for e in events)


async def test_replay_serves_buffered_batches(worker: Worker, sub: zmq.asyncio.Socket) -> None:
    ctx = zmq.asyncio.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{worker.config.kv_events_replay_port}")
    try:
        await dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        seqs = []
        while True:
            assert await dealer.poll(5000), "no replay answer"
            _, _topic, seq, payload = await dealer.recv_multipart()
            n = int.from_bytes(seq, "big", signed=True)
            if n == -1:
                break
            decode_batch(payload)
            seqs.append(n)
        assert seqs and seqs == sorted(seqs) and seqs[0] == 0
    finally:
        dealer.close(0)
        ctx.term()
