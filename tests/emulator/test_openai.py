"""/v1/chat/completions and /v1/completions: OpenAI shapes, and a follow-up turn hits the cache."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.emulator.conftest import MODEL, PAGE, Worker


def _chat(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": messages, **extra}


async def test_chat_completion_shape(worker: Worker) -> None:
    messages = [{"role": "user", "content": "hello there, emulator"}]
    status, out = await worker.post(
        "/v1/chat/completions", _chat(messages, max_tokens=10, ignore_eos=True)
    )
    assert status == 200, out
    assert out["object"] == "chat.completion" and out["model"] == MODEL
    assert out["id"] and isinstance(out["created"], int)
    (choice,) = out["choices"]
    assert choice["finish_reason"] == "stop"
    assert choice["matched_stop"] == worker.codec.im_end_id
    assert choice["message"]["role"] == "assistant"
    # 10 tokens in all: 9 of text and the end of the turn
    assert len(worker.codec.encode(choice["message"]["content"])) == 9
    usage = out["usage"]
    prompt = worker.codec.render_messages(messages, add_generation_prompt=True)
    assert usage["prompt_tokens"] == len(prompt)
    assert usage["completion_tokens"] == 10
    assert usage["total_tokens"] == len(prompt) + 10
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    assert "sglext" not in out


async def test_chat_default_length(worker: Worker) -> None:
    forced = _chat([{"role": "user", "content": "x"}], ignore_eos=True)
    _, out = await worker.post("/v1/chat/completions", forced)
    assert out["usage"]["completion_tokens"] == 64


async def test_follow_up_turn_hits_the_history(worker: Worker) -> None:
    """Turn 2 carries turn 1's answer: every full page of the history is served from cache."""
    turn1 = [
        {"role": "system", "content": "You are a careful coding agent. " * 8},
        {"role": "user", "content": "List the files in the repository."},
    ]
    _, out1 = await worker.post("/v1/chat/completions", _chat(turn1, max_tokens=30))
    answer = out1["choices"][0]["message"]["content"]
    turn2 = [*turn1, {"role": "assistant", "content": answer},
             {"role": "user", "content": "Now open the README."}]  # fmt: skip
    status, out2 = await worker.post(
        "/v1/chat/completions", _chat(turn2, max_tokens=5, return_cached_tokens_details=True)
    )
    assert status == 200, out2
    prompt1 = worker.codec.render_messages(turn1, add_generation_prompt=True)
    history = len(prompt1) + 30  # prompt, answer text, im_end
    cached = out2["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached % PAGE == 0
    assert cached >= (history - 1) // PAGE * PAGE  # the last token's KV is never computed
    assert out2["sglext"]["cached_tokens_details"] == {"device": cached, "host": 0}


async def test_chat_stream_with_usage(worker: Worker) -> None:
    messages = [{"role": "user", "content": "stream me something"}]
    usage = {"include_usage": True}
    body = _chat(messages, max_tokens=12, ignore_eos=True, stream=True, stream_options=usage,
                 return_cached_tokens_details=True)  # fmt: skip
    events = await worker.sse("/v1/chat/completions", body)
    assert events[-1] == "[DONE]"
    # SGLang's layout: a role chunk, content chunks, a finish chunk; then usage (no sglext chunk:
    # there was no cache hit to detail)
    role, *chunks, finish, usage_chunk = events[:-1]
    assert len(chunks) > 1
    assert all(c["object"] == "chat.completion.chunk" for c in events[:-1])
    assert len({c["id"] for c in events[:-1]}) == 1
    assert role["choices"][0]["delta"] == {"reasoning_content": None, "role": "assistant",
                                           "content": ""}  # fmt: skip
    assert all(c["choices"][0]["finish_reason"] is None for c in [role, *chunks])
    assert all(set(c["choices"][0]["delta"]) == {"reasoning_content", "content"} for c in chunks)
    assert finish["choices"][0]["delta"] == {"reasoning_content": None}
    assert finish["choices"][0]["finish_reason"] == "stop"
    assert finish["choices"][0]["matched_stop"] == worker.codec.im_end_id
    text = "".join(c["choices"][0]["delta"]["content"] for c in chunks)
    assert len(worker.codec.encode(text)) == 11
    assert usage_chunk["choices"] == [] and "sglext" not in usage_chunk
    assert usage_chunk["usage"]["completion_tokens"] == 12
    assert usage_chunk["usage"]["completion_tokens_details"] is None
    # the same request, not streamed, answers the same text
    _, whole = await worker.post(
        "/v1/chat/completions", _chat(messages, max_tokens=12, ignore_eos=True)
    )
    assert whole["choices"][0]["message"]["content"] == text


async def test_completions_stream_and_not(worker: Worker) -> None:
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 7}
    status, out = await worker.post("/v1/completions", body)
    assert status == 200, out
    assert out["object"] == "text_completion"
    (choice,) = out["choices"]
    assert choice["finish_reason"] == "length"
    assert len(worker.codec.encode(choice["text"])) == 7
    assert out["usage"]["prompt_tokens"] == len(worker.codec.prompt_ids("Once upon a time"))
    events = await worker.sse("/v1/completions", {**body, "stream": True})
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == choice["text"]
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    # token-id prompts and max_completion_tokens
    ids = worker.codec.prompt_ids("Once upon a time")
    _, by_ids = await worker.post(
        "/v1/completions", {"model": MODEL, "prompt": ids, "max_completion_tokens": 7}
    )
    assert by_ids["choices"][0]["text"] == choice["text"]


async def test_any_model_name_is_served_and_echoed(worker: Worker) -> None:
    """SGLang serves one model whatever the request names, and echoes the name (default
    "default"); only the LoRA form base:adapter is refused (LoRA is off)."""
    msgs = [{"role": "user", "content": "x"}]
    status, out = await worker.post("/v1/chat/completions", {"model": "nope", "messages": msgs})
    assert status == 200 and out["model"] == "nope"
    status, out = await worker.post("/v1/completions", {"prompt": "x", "max_tokens": 2})
    assert status == 200 and out["model"] == "default"
    body = {"model": "a/b", "messages": msgs, "max_tokens": 3, "stream": True}
    events = await worker.sse("/v1/chat/completions", body)
    assert {e["model"] for e in events[:-1]} == {"a/b"}
    for model, adapter in (("base:lora-1", "lora-1"), (f"{MODEL}:x", "x")):
        status, out = await worker.post("/v1/chat/completions", {"model": model, "messages": msgs})
        assert status == 400 and out["type"] == "BadRequestError"
        assert f"LoRA adapter '{adapter}' was requested, but LoRA is not enabled" in out["message"]


async def test_openai_errors(worker: Worker) -> None:
    async with worker.http.post(worker.url + "/v1/chat/completions", data=b"{oops") as r:
        assert r.status == 400
        out = await r.json()
        # FastAPI's request validation: the OpenAI error body with type "Bad Request"
        assert (out["object"], out["type"], out["code"]) == ("error", "Bad Request", 400)
    status, out = await worker.post("/v1/chat/completions", {"max_tokens": 2})
    assert (status, out["type"]) == (400, "Bad Request")  # messages missing
    bad: list[dict[str, Any]] = [
        {"model": MODEL, "messages": []},
        {"model": MODEL, "messages": [{"content": "no role"}]},
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 2},
    ]
    for body in bad:
        status, out = await worker.post("/v1/chat/completions", body)
        assert status == 400, body
    status, _ = await worker.post("/v1/completions", {"model": MODEL, "prompt": {"a": 1}})
    assert status == 400


async def test_openai_sdk_client(worker: Worker) -> None:
    client = openai.AsyncOpenAI(base_url=worker.url + "/v1", api_key="unused")
    try:
        reply = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "sdk"}],
            max_tokens=6,
            extra_body={"ignore_eos": True},
        )
        assert reply.choices[0].finish_reason == "stop"
        assert reply.usage is not None and reply.usage.completion_tokens == 6
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "sdk"}],
            max_tokens=6,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text == reply.choices[0].message.content
        other = await client.chat.completions.create(
            model="missing", messages=[{"role": "user", "content": "sdk"}], max_tokens=2
        )
        assert other.model == "missing"
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(
                model="base:adapter", messages=[{"role": "user", "content": "sdk"}]
            )
    finally:
        await client.close()
