"""Anthropic Messages through the router, with the `anthropic` client against launched emulated
workers: a multi-turn tool-use session sticks to its worker and its cached tokens cover the history,
streamed and not; count_tokens; the router's own errors on these paths in Anthropic's shape,
x-api-key accepted, and a stream cut closed with an Anthropic error event.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import anthropic
import pytest

from smetric_router.features import anthropic_thinking
from smetric_router.features.anthropic_thinking import CONTEXT_EDIT
from smetric_router.launch import ClusterSpec, RouterSpec, Stack, WorkerSpec
from tests.e2e.conftest import ROUTER_ARGS, SPEEDUP, StackFactory
from tests.e2e.raw import stream_cut_by_its_worker
from tests.helpers.prometheus import total

SYSTEM = "You are a coding agent working in a Python repository. " * 8
TOOLS: list[Any] = [
    {
        "name": "read_file",
        "description": "Read a file of the repository.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]
TURNS = 5


def _session_turns(client: anthropic.Anthropic, model: str, stream: bool, page: int) -> None:
    """TURNS requests of one session, each answered with text plus a tool call whose result the
    next request carries (the agent loop of Claude Code)."""
    messages: list[Any] = [{"role": "user", "content": "The test test_parse fails; fix it."}]
    home = None
    previous_prompt = 0
    for turn in range(TURNS):
        kwargs: dict[str, Any] = dict(
            model=model, max_tokens=12, system=SYSTEM, tools=TOOLS, messages=messages
        )
        if stream:
            raw = client.messages.with_raw_response.create(stream=True, **kwargs)
            events = list(raw.parse())
            kinds = [e.type for e in events]
            assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
            assert {"content_block_start", "content_block_delta", "message_delta"} <= set(kinds)
            usage = events[0].message.usage
            text = "".join(
                e.delta.text
                for e in events
                if e.type == "content_block_delta" and e.delta.type == "text_delta"
            )
        else:
            raw = client.messages.with_raw_response.create(**kwargs)
            reply = raw.parse()
            assert reply.type == "message" and reply.role == "assistant"
            usage = reply.usage
            text = "".join(b.text for b in reply.content if b.type == "text")
        worker, reason = raw.headers["x-smetric-worker"], raw.headers["x-smetric-reason"]
        cached = usage.cache_read_input_tokens or 0
        prompt = usage.input_tokens + cached
        if turn == 0:
            assert reason == "first-turn-balance"
            home = worker
        else:
            assert (worker, reason) == (home, "sticky"), (turn, worker, reason)
            # the whole previous prompt (its full pages) was served from the worker's cache
            assert cached >= previous_prompt // page * page, (turn, cached, previous_prompt)
        assert text
        previous_prompt = prompt
        call_id = f"toolu_{turn}"
        messages += [
            {"role": "assistant", "content": [
                {"type": "text", "text": text},
                {"type": "tool_use", "id": call_id, "name": "read_file",
                 "input": {"path": f"src/mod{turn}.py"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": call_id,
                 "content": f"def parse_{turn}(x):\n    return int(x)\n"},
            ]},
        ]  # fmt: skip


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_tool_use_session_sticks_and_hits_its_history(
    make_stack: StackFactory, stream: bool
) -> None:
    stack = make_stack(workers=4)
    page = stack.spec.workers.page_size
    client = anthropic.Anthropic(base_url=stack.url, api_key="none", max_retries=0)
    _session_turns(client, stack.spec.workers.model_name, stream, page)


def test_count_tokens_equals_the_workers_prompt(make_stack: StackFactory) -> None:
    stack = make_stack(workers=2)
    model = stack.spec.workers.model_name
    client = anthropic.Anthropic(base_url=stack.url, api_key="none", max_retries=0)
    messages: Any = [
        {"role": "user", "content": "Read a.py"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a.py"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "x = 1"}]},
    ]  # fmt: skip
    counted = client.messages.count_tokens(
        model=model, system=SYSTEM, tools=TOOLS, messages=messages
    )
    reply = client.messages.create(
        model=model, max_tokens=4, system=SYSTEM, tools=TOOLS, messages=messages
    )
    served = reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0)
    assert counted.input_tokens == served > 0


def _stack_with(*router_args: str) -> Stack:
    spec = ClusterSpec(
        router=RouterSpec(port=0, extra_args=ROUTER_ARGS + router_args),
        workers=WorkerSpec(count=1, speedup=SPEEDUP),
    )
    return Stack(spec)


def _anthropic_error(status: int, body: bytes, kind: str) -> str:
    obj = json.loads(body)
    assert obj["type"] == "error" and obj["error"]["type"] == kind, (status, obj)
    assert set(obj) == {"type", "error"} and isinstance(obj["error"]["message"], str)
    return str(obj["error"]["message"])


async def test_router_errors_in_anthropic_shape_and_x_api_key() -> None:
    stack = _stack_with("--api-key", "sekrit", "--max-body-bytes", "4096")
    stack.start()
    try:
        url = stack.url + "/v1/messages"
        good: dict[str, Any] = {
            "model": "m",
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}],
        }
        key = {"x-api-key": "sekrit", "anthropic-version": "2023-06-01"}
        cases: list[tuple[dict[str, str], Any, int, str]] = [
            ({}, good, 401, "authentication_error"),
            ({"x-api-key": "wrong"}, good, 401, "authentication_error"),
            (key, b"{not json", 400, "invalid_request_error"),
            (key, {**good, "messages": [{"role": "tool", "content": "x"}]}, 400,
             "invalid_request_error"),
            (key, {**good, "max_tokens": 10**9}, 400, "invalid_request_error"),
            (key, {**good, "system": "x" * 8000}, 413, "request_too_large"),
        ]  # fmt: skip
        async with aiohttp.ClientSession() as http:
            for headers, body, status, kind in cases:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                h = {"Content-Type": "application/json", **headers}
                async with http.post(url, data=data, headers=h) as r:
                    assert r.status == status, (headers, body, r.status, await r.text())
                    _anthropic_error(status, await r.read(), kind)
            h = {"Content-Type": "text/plain", **key}
            async with http.post(url, data=b"hi", headers=h) as r:
                assert r.status == 415
                _anthropic_error(415, await r.read(), "invalid_request_error")
            async with http.get(url, headers=key) as r:
                assert r.status == 405
                _anthropic_error(405, await r.read(), "invalid_request_error")
            async with http.post(url + "/count_tokens", json={"model": "m"}, headers=key) as r:
                assert r.status == 400
                _anthropic_error(400, await r.read(), "invalid_request_error")
            # the key in x-api-key (Claude Code's way) or as Bearer, beta headers accepted
            for auth in (key, {"Authorization": "Bearer sekrit"}):
                h = {**auth, "anthropic-beta": "prompt-caching-2024-07-31"}
                async with http.post(url, json=good, headers=h) as r:
                    assert r.status == 200, await r.text()
                    assert (await r.json())["type"] == "message"
        # the anthropic client itself reads the router's error as its typed exception
        client = anthropic.Anthropic(base_url=stack.url, api_key="wrong", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError):
            client.messages.create(**good)
    finally:
        stack.stop()


async def test_worker_lost_mid_stream_ends_with_an_anthropic_error_event(
    make_stack: StackFactory,
) -> None:
    stack = make_stack(workers=1)
    worker = stack.worker_urls[0]
    body = {
        "model": "m",
        "max_tokens": 40,
        "stream": True,
        "messages": [{"role": "user", "content": "Explain list comprehensions."}],
    }
    frames = await stream_cut_by_its_worker(stack.url, worker, "/v1/messages", body)
    assert frames[0].startswith("event: message_start"), frames
    last = frames[-1].splitlines()
    assert last[0] == "event: error", frames
    data = json.loads(last[1].removeprefix("data: "))
    assert data["type"] == "error" and data["error"]["type"] == "api_error", data
    assert "lost mid-stream" in data["error"]["message"]
    assert all("[DONE]" not in f for f in frames)


# A request as Claude Code 2.1.332 sends it (its fields, not its prompt)
CLAUDE_CODE_HEADERS = {
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,"
    "context-management-2025-06-27,effort-2025-11-24",
    "x-claude-code-session-id": "15dfb15b-8af1-4f0d-9179-792667e49d3e",
}


def _claude_code_body(stream: bool) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 8,
        "stream": stream,
        "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Fix calc.py"}]}],
        "tools": [*TOOLS, {**TOOLS[0], "name": "later", "defer_loading": True}],
        "metadata": {"user_id": '{"session_id": "15dfb15b-8af1-4f0d-9179-792667e49d3e"}'},
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
    }


@pytest.mark.parametrize("mode", ["drop", "reject"])
async def test_thinking_for_workers_without_a_reasoning_parser(mode: str) -> None:
    """Served without `thinking` by default; SGLang's own 400 with --anthropic-thinking reject;
    never a 5xx. count_tokens answers as the workers would."""
    stack = _stack_with("--anthropic-thinking", mode)
    stack.start()
    try:
        url = stack.url + "/v1/messages"
        async with aiohttp.ClientSession() as http:
            for stream in (False, True):
                body = _claude_code_body(stream)
                async with http.post(url, json=body, headers=CLAUDE_CODE_HEADERS) as r:
                    data = await r.read()
                    if mode == "reject":
                        assert r.status == 400, data
                        message = _anthropic_error(400, data, "invalid_request_error")
                        assert message == anthropic_thinking.REFUSAL
                        continue
                    assert r.status == 200, data
                    assert r.headers["x-smetric-reason"] == "first-turn-balance"
                    if stream:
                        assert data.rstrip().endswith(b'data: {"type":"message_stop"}'), data
                    else:
                        assert json.loads(data)["type"] == "message"
            count = {k: v for k, v in _claude_code_body(False).items() if k != "max_tokens"}
            async with http.post(url + "/count_tokens", json=count) as r:
                assert r.status == (400 if mode == "reject" else 200), await r.text()
            async with http.get(stack.url + "/metrics") as r:
                metrics = await r.text()
        dropped = 0 if mode == "reject" else 2
        assert total(metrics, "smetric_anthropic_dropped_total", field="thinking") == dropped
        edits = total(metrics, "smetric_anthropic_dropped_total", field=CONTEXT_EDIT)
        assert edits == dropped
    finally:
        stack.stop()
