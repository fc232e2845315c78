"""/generate: SGLang's native shape, streaming and not."""

from __future__ import annotations

import asyncio
import itertools

from tests.emulator.conftest import Worker

META_KEYS = {"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens"}


async def test_generate_returns_sglang_shape(worker: Worker) -> None:
    prompt = list(range(100, 140))
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 8}}
    status, out = await worker.post("/generate", body)
    assert status == 200, out
    meta = out["meta_info"]
    assert set(meta) >= META_KEYS
    assert meta["finish_reason"] == {"type": "length", "length": 8}
    assert meta["prompt_tokens"] == 40 and meta["completion_tokens"] == 8
    assert meta["cached_tokens"] == 0 and meta["cached_tokens_details"] is None  # no hit: null
    assert meta["e2e_latency"] > 0
    # --enable-metrics timing keys, in SGLang's order of events
    received, entered = meta["request_received_ts"], meta["forward_entry_time"]
    assert received <= entered <= meta["prefill_finished_time"] <= meta["request_finished_ts"]
    assert meta["queue_time"] == entered - received and meta["decode_throughput"] > 0
    assert meta["weight_versions"] == [{"version": "default", "start": 0, "end": 8}]
    assert len(out["output_ids"]) == 8
    assert worker.codec.encode(out["text"]) == out["output_ids"]


async def test_generate_default_length_text_prompt_and_reproducible(worker: Worker) -> None:
    text = "the same prompt twice"
    body = {"text": text, "sampling_params": {}}
    _, first = await worker.post("/generate", body)
    _, second = await worker.post("/generate", body)
    assert first["meta_info"]["completion_tokens"] == 128  # SGLang's max_new_tokens default
    assert first["meta_info"]["prompt_tokens"] == len(worker.codec.prompt_ids(text))
    assert first["text"] == second["text"]
    assert second["meta_info"]["cached_tokens"] == 0  # 5-token prompt: no full page
    _, other = await worker.post("/generate", {"text": "another prompt", "sampling_params": {}})
    assert other["text"] != first["text"]


async def test_generate_streams_incrementally(worker: Worker) -> None:
    body = {"input_ids": list(range(50)), "sampling_params": {"max_new_tokens": 12}, "stream": True}
    events = await worker.sse("/generate", body)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) > 1
    first, last = chunks[0], chunks[-1]
    assert first["meta_info"]["finish_reason"] is None
    assert first["meta_info"]["completion_tokens"] < 12
    assert "e2e_latency" not in first["meta_info"] and "weight_versions" not in first["meta_info"]
    assert "response_sent_to_client_ts" in first["meta_info"]
    assert all("response_sent_to_client_ts" not in c["meta_info"] for c in chunks[1:-1])
    assert last["meta_info"]["finish_reason"] == {"type": "length", "length": 12}
    assert "e2e_latency" in last["meta_info"]
    # text and output_ids are cumulative
    for a, b in itertools.pairwise(chunks):
        assert b["text"].startswith(a["text"])
        assert b["output_ids"][: len(a["output_ids"])] == a["output_ids"]
    assert worker.codec.encode(last["text"]) == last["output_ids"]


async def test_first_chunk_arrives_before_the_request_finishes(worker: Worker) -> None:
    body = {"input_ids": list(range(20)), "sampling_params": {"max_new_tokens": 400}}
    async with worker.http.post(worker.url + "/generate", json={**body, "stream": True}) as r:
        line = await r.content.readline()
        assert line.startswith(b"data: ")
        _, loads = await worker.get("/v1/loads")
        assert loads["loads"][0]["num_running_reqs"] == 1  # still generating


async def test_generate_follow_up_hits_cache_with_details(worker: Worker) -> None:
    prompt = list(range(1000, 1050))
    _, first = await worker.post(
        "/generate", {"input_ids": prompt, "sampling_params": {"max_new_tokens": 20}}
    )
    history = prompt + first["output_ids"]
    follow = history + list(range(2000, 2010))
    _, second = await worker.post(
        "/generate", {"input_ids": follow, "sampling_params": {"max_new_tokens": 2}}
    )
    meta = second["meta_info"]
    # every full page of the history but the last token (whose KV is never computed)
    assert meta["cached_tokens"] >= (len(history) - 1) // 16 * 16 > 0
    assert meta["cached_tokens"] % 16 == 0
    assert meta["cached_tokens_details"]["device"] == meta["cached_tokens"]
    assert meta["cached_tokens_details"]["host"] == 0


async def test_generate_rejects_bad_input(worker: Worker) -> None:
    status, out = await worker.post("/generate", {"sampling_params": {}})
    assert status == 400 and "error" in out
    status, _ = await worker.post("/generate", {"text": "x", "input_ids": [1]})
    assert status == 400
    status, _ = await worker.post(
        "/generate", {"text": "x", "sampling_params": {"max_new_tokens": -1}}
    )
    assert status == 400
    async with worker.http.post(worker.url + "/generate", data=b"{not json") as r:
        assert r.status == 400


async def test_duplicate_rid_in_flight_is_refused(worker: Worker) -> None:
    body = {"input_ids": [1, 2, 3], "rid": "dup", "sampling_params": {"max_new_tokens": 300}}
    first = asyncio.ensure_future(worker.post("/generate", body))
    # poll until the first one runs
    for _ in range(500):
        _, loads = await worker.get("/v1/loads")
        if loads["loads"][0]["num_running_reqs"]:
            break
        await asyncio.sleep(0.01)
    status, _ = await worker.post("/generate", body)
    assert status == 400
    status, out = await first
    assert status == 200 and out["meta_info"]["id"] == "dup"


async def test_abort_request_ends_the_stream(worker: Worker) -> None:
    body = {"input_ids": [5] * 20, "rid": "to-abort", "stream": True,
            "sampling_params": {"max_new_tokens": 5000}}  # fmt: skip
    async with worker.http.post(worker.url + "/generate", json=body) as r:
        assert (await r.content.readline()).startswith(b"data: ")
        status, _ = await worker.post("/abort_request", {"rid": "to-abort"})
        assert status == 200
        lines = [line async for line in r.content if line.startswith(b"data: ")]
    assert lines[-1].strip() == b"data: [DONE]"
    assert b'"type":"abort"' in lines[-2]
