"""Details of SGLang 0.5.23's HTTP surface the emulator copies (checked against a live worker by
tests/real_sglang/test_emulator_shape.py): error bodies, content types, /v1/loads sections."""

from __future__ import annotations

from typing import Any

from tests.emulator.conftest import Worker

PROMPT = {"input_ids": list(range(100, 140)), "sampling_params": {"max_new_tokens": 2}}


async def test_unknown_paths_and_methods_answer_like_fastapi(worker: Worker) -> None:
    async with worker.http.get(worker.url + "/no/such/path") as r:
        assert (r.status, await r.json()) == (404, {"detail": "Not Found"})
    async with worker.http.get(worker.url + "/generate") as r:
        assert (r.status, await r.json()) == (405, {"detail": "Method Not Allowed"})
        assert "POST" in r.headers["Allow"]


async def test_generate_errors(worker: Worker) -> None:
    async with worker.http.post(worker.url + "/generate", data=b"{nope") as r:
        out = await r.json()  # request validation: the OpenAI body, type "Bad Request"
        assert (r.status, out["object"], out["type"], out["code"]) == (
            400,
            "error",
            "Bad Request",
            400,
        )
    checks: list[tuple[dict[str, Any], str]] = [
        ({"sampling_params": {}}, "Either text, input_ids or input_embeds should be provided."),
        ({**PROMPT, "sampling_params": {"max_new_tokens": -1}},
         "max_new_tokens must be at least 0, got -1."),
        ({**PROMPT, "sampling_params": {"temperature": -0.5}},
         "temperature must be a non-negative finite number, got -0.5."),
    ]  # fmt: skip
    for body, message in checks:
        status, out = await worker.post("/generate", body)
        assert (status, out) == (400, {"error": {"message": message}})
    # max_new_tokens 0 is allowed: the prompt is prefilled, nothing generated
    status, out = await worker.post(
        "/generate", {**PROMPT, "sampling_params": {"max_new_tokens": 0}}
    )
    assert status == 200 and out["output_ids"] == [] and out["meta_info"]["completion_tokens"] == 0


async def test_content_types(worker: Worker) -> None:
    async with worker.http.post(worker.url + "/generate", json={**PROMPT, "stream": True}) as r:
        assert r.headers["Content-Type"] == "text/event-stream; charset=utf-8"
        await r.read()
    async with worker.http.get(worker.url + "/metrics") as r:
        assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    async with worker.http.get(worker.url + "/v1/loads?format=prometheus") as r:
        assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert "sglang_num_total_tokens" in await r.text()
    for method in ("GET", "POST"):  # SGLang's flush_cache Response has no media type
        async with worker.http.request(method, worker.url + "/flush_cache") as r:
            assert r.status == 200 and "Content-Type" not in r.headers
            assert (await r.text()).startswith("Cache flushed.\n")
    async with worker.http.get(worker.url + "/flush_cache?timeout=-1") as r:
        assert r.status == 400 and (await r.json())["type"] == "Bad Request"


async def test_v1_loads_sections(worker: Worker) -> None:
    await worker.post("/generate", PROMPT)
    _, out = await worker.get("/v1/loads")
    (entry,) = out["loads"]
    assert {"memory", "disaggregation", "queues"} <= set(entry)
    assert entry["disaggregation"]["mode"] == "null" and entry["utilization"] == 0.0
    assert entry["total_prefill_busy_us"] > 0
    steps, batch, us, *_ = entry["decode_moments"]  # one decode step per token after the first
    assert steps >= 1 and batch >= 1 and us > 0
    _, core = await worker.get("/v1/loads?include=core")
    assert not {"memory", "disaggregation", "queues"} & set(core["loads"][0])
    _, some = await worker.get("/v1/loads?include=queues")
    assert "queues" in some["loads"][0] and "memory" not in some["loads"][0]
    status, _ = await worker.get("/v1/loads?include=bogus")
    assert status == 500  # SGLang 0.5.23 lets the ValueError escape


async def test_openai_replies_carry_sglang_extras(worker: Worker) -> None:
    msgs = [{"role": "user", "content": "extras"}]
    _, out = await worker.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 3})
    assert out["choices"][0]["message"]["reasoning_content"] is None
    assert out["usage"]["completion_tokens_details"] is None
    versions = [{"version": "default", "start": 0, "end": 3}]
    assert out["metadata"] == {"weight_version": "default", "weight_versions": versions}
    assert "sglext" not in out  # not asked for
    body = {
        "prompt": "extras",
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = await worker.sse("/v1/completions", body)
    *chunks, usage, done = events
    assert all(c["usage"] is None for c in chunks) and done == "[DONE]"
    assert "completion_tokens_details" not in usage["usage"]  # written without nulls
