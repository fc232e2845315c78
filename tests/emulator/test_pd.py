"""PD roles: a prefill and a decode instance paired per request by SGLang's bootstrap fields."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import zmq
import zmq.asyncio

from smetric_router.core.kv_events import BlockStored, decode_batch
from smetric_router.emulator.pd import transfer_seconds
from smetric_router.engine.api import EngineConfig
from smetric_router.features.hashing import page_hashes
from tests.emulator.conftest import MODEL, PAGE, Worker, free_ports, make_config, serving
from tests.helpers.polling import eventually

KV_TIMEOUT_S = 0.5
_rooms = itertools.count(1 << 40)


@pytest.fixture
async def prefill() -> AsyncIterator[Worker]:
    async with serving(make_config(role="prefill")) as w:
        yield w


@pytest.fixture
async def decode() -> AsyncIterator[Worker]:
    async with serving(make_config(role="decode", decode_kv_timeout_s=KV_TIMEOUT_S)) as w:
        yield w


def paired(body: dict[str, Any], prefill: Worker, room: int | None = None) -> dict[str, Any]:
    """The body a PD router sends to both instances (SGLang's mini_lb injection)."""
    return {
        **body,
        "bootstrap_host": prefill.config.host,
        "bootstrap_port": prefill.config.bootstrap_port,
        "bootstrap_room": next(_rooms) if room is None else room,
    }


def chat(content: str, max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    """A chat of exactly max_tokens answer tokens (ignore_eos), so pairs can be counted."""
    messages = [{"role": "user", "content": content}]
    return {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "ignore_eos": True,
            **extra}  # fmt: skip


async def _idle(w: Worker) -> dict[str, Any]:
    """The worker's /v1/loads entry once it holds no request."""

    async def entry() -> dict[str, Any] | None:
        _, loads = await w.get("/v1/loads")
        entry: dict[str, Any] = loads["loads"][0]
        return entry if entry["num_running_reqs"] + entry["num_waiting_reqs"] == 0 else None

    return await eventually(entry, f"{w.url} holding no request")


async def test_pair_answers_what_a_colocated_worker_answers(
    prefill: Worker, decode: Worker
) -> None:
    body = chat("tell me about paged attention", max_tokens=12)
    async with serving(make_config()) as colocated:
        _, alone = await colocated.post("/v1/chat/completions", body)
    pd = paired(body, prefill)
    (p_status, p), (d_status, d) = await asyncio.gather(
        prefill.post("/v1/chat/completions", pd), decode.post("/v1/chat/completions", pd)
    )
    assert (p_status, d_status) == (200, 200)
    assert d["choices"][0]["message"] == alone["choices"][0]["message"]
    assert d["choices"][0]["finish_reason"] == "stop"
    assert d["usage"]["completion_tokens"] == 12
    # the prefill answers its first token only, once its prefill is done
    assert p["usage"]["completion_tokens"] == 1
    assert p["choices"][0]["finish_reason"] == "length"
    assert alone["choices"][0]["message"]["content"].startswith(
        p["choices"][0]["message"]["content"]
    )
    assert p["usage"]["prompt_tokens"] == d["usage"]["prompt_tokens"]

    pd = paired({**body, "stream": True}, prefill)
    p_events, d_events = await asyncio.gather(
        prefill.sse("/v1/chat/completions", pd), decode.sse("/v1/chat/completions", pd)
    )
    assert p_events[-1] == d_events[-1] == "[DONE]"
    streamed = "".join(e["choices"][0]["delta"].get("content", "") for e in d_events[:-1])
    assert streamed == alone["choices"][0]["message"]["content"]
    assert d_events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert len(p_events) == 4  # SGLang's chat stream: role, the first token, finish, [DONE]


async def test_decode_reports_the_prefills_cache_hit(prefill: Worker, decode: Worker) -> None:
    prompt = list(range(1000, 1000 + 8 * PAGE))
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 4}}
    for expected in (0, 7 * PAGE):  # the second time the prefill holds all but the last page
        pd = paired(body, prefill)
        (_, p), (status, d) = await asyncio.gather(
            prefill.post("/generate", pd), decode.post("/generate", pd)
        )
        assert status == 200, d
        assert p["meta_info"]["cached_tokens"] == d["meta_info"]["cached_tokens"] == expected
        assert len(d["output_ids"]) == 4 and d["meta_info"]["finish_reason"]["type"] == "length"


async def test_decode_waits_the_modelled_transfer() -> None:
    n_prompt, wall_s = 4000, 0.6
    speedup = 50.0
    # a link slow enough that n_prompt tokens of KV take wall_s seconds at this speed-up
    gbps = transfer_seconds(n_prompt, 98_304, 1.0) / (wall_s * speedup)
    async with (
        serving(make_config(role="prefill", speedup=speedup)) as prefill,
        serving(make_config(role="decode", speedup=speedup, transfer_gbps=gbps)) as decode,
    ):

        async def first_chunk_after_prefill(prompt: list[int]) -> float:
            body = paired(
                {"input_ids": prompt, "stream": True, "sampling_params": {"max_new_tokens": 2}},
                prefill,
            )
            status, _ = await prefill.post("/generate", {**body, "stream": False})
            assert status == 200  # the KV is ready from here on
            start = time.monotonic()
            async with decode.http.post(decode.url + "/generate", json=body) as r:
                async for line in r.content:
                    if line.startswith(b"data: "):
                        return time.monotonic() - start
            raise AssertionError("no chunk from the decode instance")

        assert await first_chunk_after_prefill([5] * n_prompt) >= wall_s
        assert await first_chunk_after_prefill([6] * PAGE) < wall_s / 2  # a short prompt's KV


async def test_decode_times_out_cleanly_without_a_handover(prefill: Worker, decode: Worker) -> None:
    status, _ = await prefill.post("/emulator/faults", {"withhold_kv_next": 1})
    assert status == 200
    pd = paired(chat("never handed over"), prefill)
    start = time.monotonic()
    (p_status, _), (d_status, d) = await asyncio.gather(
        prefill.post("/v1/chat/completions", pd), decode.post("/v1/chat/completions", pd)
    )
    assert p_status == 200  # the prefill itself succeeded
    assert d_status == 500 and "timed out" in d["message"], d
    assert KV_TIMEOUT_S <= time.monotonic() - start < KV_TIMEOUT_S + 3

    # streamed, against a bootstrap port nobody serves: an error event, then [DONE]
    (nobody,) = free_ports(1)
    body = {**paired(chat("no prefill at all", stream=True), prefill), "bootstrap_port": nobody}
    events = await decode.sse("/v1/chat/completions", body)
    assert events[-1] == "[DONE]" and len(events) == 2
    assert events[0]["error"]["code"] == 500 and "timed out" in events[0]["error"]["message"]

    gen = {**paired({"text": "no prefill either"}, prefill), "bootstrap_port": nobody}
    status, d = await decode.post("/generate", gen)
    assert status == 500 and "timed out" in d["error"]["message"]
    await _idle(decode)
    # the instances serve the next pair as usual
    pd = paired(chat("after the fault"), prefill)
    results = await asyncio.gather(
        prefill.post("/v1/chat/completions", pd), decode.post("/v1/chat/completions", pd)
    )
    assert [s for s, _ in results] == [200, 200]


async def test_decode_before_prefill_waits_for_it(prefill: Worker, decode: Worker) -> None:
    pd = paired(chat("decode first"), prefill)
    pending = asyncio.ensure_future(decode.post("/v1/chat/completions", pd))
    await asyncio.sleep(0.2)
    assert not pending.done()
    assert (await prefill.post("/v1/chat/completions", pd))[0] == 200
    status, d = await asyncio.wait_for(pending, 5)
    assert status == 200 and d["usage"]["completion_tokens"] == 8


async def test_prefill_publishes_kv_events(prefill: Worker) -> None:
    messages = [{"role": "user", "content": "hash these prefill pages " * 12}]
    prompt = prefill.codec.render_messages(messages, add_generation_prompt=True)
    expected = page_hashes(prompt, PAGE)
    assert len(expected) >= 3
    pd = paired({"model": MODEL, "messages": messages, "max_tokens": 5}, prefill)
    assert (await prefill.post("/v1/chat/completions", pd))[0] == 200
    ctx = zmq.asyncio.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{prefill.config.kv_events_replay_port}")
    hashes: list[int] = []
    try:
        await dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        while True:
            assert await dealer.poll(5000), "no replay answer"
            _, _topic, seq, payload = await dealer.recv_multipart()
            if int.from_bytes(seq, "big", signed=True) == -1:
                break
            for e in decode_batch(payload).events:
                if isinstance(e, BlockStored):
                    hashes += e.block_hashes
    finally:
        dealer.close(0)
        ctx.term()
    assert hashes[: len(expected)] == expected


async def test_roles_in_server_info_and_health_without_a_pair(
    prefill: Worker, decode: Worker, worker: Worker
) -> None:
    for w, role in ((prefill, "prefill"), (decode, "decode"), (worker, "null")):
        _, info = await w.get("/server_info")
        assert info["disaggregation_mode"] == role
        assert info["disaggregation_bootstrap_port"] == w.config.bootstrap_port
        _, model = await w.get("/model_info")
        assert model["disaggregation_mode"] == role
        assert (await w.get("/health"))[0] == 200
    # colocated workers ignore bootstrap fields, as SGLang's null mode does
    assert (await worker.post("/v1/chat/completions", paired(chat("x"), prefill)))[0] == 200


@pytest.mark.parametrize(
    ("role", "fields", "message"),
    [
        ("prefill", {}, "bootstrap_room"),
        ("prefill", {"bootstrap_room": 2**63}, "bootstrap_room"),
        ("decode", {"bootstrap_room": 1}, "bootstrap_host"),
        ("decode", {"bootstrap_room": 1, "bootstrap_host": "h", "bootstrap_port": "x"}, "port"),
    ],
)
async def test_bad_bootstrap_fields_are_rejected(
    role: str, fields: dict[str, Any], message: str
) -> None:
    async with serving(make_config(role=role)) as w:
        status, body = await w.post("/v1/chat/completions", {**chat("x"), **fields})
        assert status == 400 and message in body["message"]
        await _idle(w)


async def test_loads_report_unprefilled_tokens_and_decode_usage() -> None:
    engine = EngineConfig(page_size=PAGE, gpu_kv_tokens=1 << 16, max_running_requests=1)
    async with (
        serving(make_config(role="prefill", speedup=5.0, engine=engine)) as prefill,
        serving(make_config(role="decode", speedup=5.0)) as decode,
    ):
        prompts = [[100 + i] * 3000 for i in range(3)]
        bodies = [
            paired({"input_ids": p, "sampling_params": {"max_new_tokens": 200}}, prefill)
            for p in prompts
        ]
        prefills = [asyncio.ensure_future(prefill.post("/generate", b)) for b in bodies]
        decodes = [asyncio.ensure_future(decode.post("/generate", b)) for b in bodies]
        seen_waiting, seen_used = 0, 0
        deadline = time.monotonic() + 10
        while not all(d.done() for d in decodes):
            assert time.monotonic() < deadline
            _, p_loads = await prefill.get("/v1/loads")
            _, d_loads = await decode.get("/v1/loads")
            seen_waiting = max(seen_waiting, p_loads["loads"][0]["num_waiting_uncached_tokens"])
            seen_used = max(seen_used, d_loads["loads"][0]["num_used_tokens"])
            await asyncio.sleep(0.005)
        assert all(p.result()[0] == 200 for p in prefills)
        assert all(d.result()[0] == 200 for d in decodes)
        # one runs at a time on the prefill, so the others waited with their prompts uncached
        assert seen_waiting >= 3000
        assert seen_used > 3000  # a decoding request holds its transferred prompt's KV
        p_entry, d_entry = await _idle(prefill), await _idle(decode)
        assert p_entry["num_waiting_uncached_tokens"] == 0
        assert p_entry["total_prefill_uncached_tokens"] == 3 * 3000
        assert d_entry["total_prefill_uncached_tokens"] == 0  # the decode computed no prompt
