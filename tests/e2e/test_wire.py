"""An independent subscriber decodes an emulated worker's KV events with SGLang's schema and sees
block hashes equal to SGLang's page hashes of the prompt (computed here from scratch)."""

from __future__ import annotations

import hashlib
import struct
from urllib.parse import urlsplit

import aiohttp
import msgspec
import zmq
import zmq.asyncio

from smetric_router.features.chat_tokenizer import load_chat_tokenizer
from smetric_router.features.extract import FeatureExtractor
from tests.e2e.conftest import StackFactory


def sglang_page_hashes(token_ids: list[int], page_size: int) -> list[int]:
    digest = b""
    out = []
    for i in range(len(token_ids) // page_size):
        page = token_ids[i * page_size : (i + 1) * page_size]
        digest = hashlib.sha256(digest + struct.pack(f"<{page_size}I", *page)).digest()
        out.append(int.from_bytes(digest[:8], "big", signed=True))
    return out


async def test_independent_subscriber_sees_sglang_page_hashes(make_stack: StackFactory) -> None:
    stack = make_stack(workers=1)
    worker = stack.worker_urls[0]
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{worker}/server_info") as r:
            kv = (await r.json())["kv_events"]
        assert kv["publisher"] == "zmq"
        page_size = kv["block_size"]

        ctx = zmq.asyncio.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, kv["topic"].encode())
        sub.connect(f"tcp://{urlsplit(worker).hostname}:{kv['endpoint_port_base']}")
        model = stack.spec.workers.model_name

        async def chat(content: str) -> None:
            body = {"model": model, "messages": [{"role": "user", "content": content}],
                    "max_tokens": 4}  # fmt: skip
            async with http.post(f"{worker}/v1/chat/completions", json=body) as r:
                assert r.status == 200, await r.text()

        # ZMQ subscriptions join asynchronously: warm up until a batch arrives.
        n = 0
        while not await sub.poll(100):
            n += 1
            assert n < 100, "no KV events from the worker"
            await chat(f"warm-up {n} " * 20)
        while await sub.poll(100):
            await sub.recv_multipart()

        content = "independent subscriber check " * 40
        prompt = FeatureExtractor(load_chat_tokenizer()).prompt_token_ids(
            {"messages": [{"role": "user", "content": content}]}
        )
        expected = sglang_page_hashes(prompt, page_size)
        assert len(expected) >= 4
        await chat(content)

        seen: list[int] = []
        while await sub.poll(1000):
            topic, seq, payload = await sub.recv_multipart()
            assert topic == kv["topic"].encode() and len(seq) == 8
            ts, events, _rank = msgspec.msgpack.decode(payload)  # plain arrays and maps
            assert isinstance(ts, float)
            for ev in events:
                if ev["type"] == "BlockStored" and ev.get("medium", "GPU") == "GPU":
                    assert ev["block_size"] == page_size and ev["lora_id"] is None
                    seen.extend(ev["block_hashes"])
            if set(expected) <= set(seen):
                break
        sub.close(0)
        ctx.term()
    # The prompt's pages appear in order as one parent-linked chain.
    first = seen.index(expected[0])
    assert seen[first : first + len(expected)] == expected
