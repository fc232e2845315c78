"""Offered tools get harmless, schema-valid Qwen3-Coder calls, answered in each API's shape, for
a few rounds; then the answer is text, so an agent's loop ends by itself."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from smetric_router.emulator.answer import make_answer
from smetric_router.emulator.chat import chat_prompt_ids
from smetric_router.emulator.tokenizer import load_tokenizer
from smetric_router.emulator.tool_calls import Call, plan_call
from tests.emulator.agent import (
    BASH,
    EDIT_PATH_ONLY,
    QWEN3_CODER_TEMPLATE,
    READ,
    SHELL,
    SYSTEM,
    TASK,
    WRITE,
    anthropic_tools,
    chat_tools,
    check_arguments,
    responses_tools,
)
from tests.emulator.conftest import PAGE, Worker, make_config, serving

Json = dict[str, Any]
CALL_ID = "call_"


@pytest.fixture
async def agent_worker() -> AsyncIterator[Worker]:
    """A worker whose template renders assistant tool calls as the model writes them."""
    async with serving(make_config(chat_template=QWEN3_CODER_TEMPLATE)) as w:
        yield w


def _chat_body(messages: list[Json], **extra: Any) -> Json:
    return {"messages": messages, "tools": chat_tools(BASH, READ, WRITE), **extra}


def _start() -> list[Json]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]


def test_the_call_text_is_what_qwen3_coder_writes_and_its_pieces_rebuild_the_arguments() -> None:
    call = Call("shell", {"command": ["ls", "-a"], "workdir": "/tmp"})
    assert call.text == (
        "<tool_call>\n<function=shell>\n<parameter=command>\n"
        '["ls", "-a"]\n</parameter>\n<parameter=workdir>\n/tmp\n</parameter>\n'
        "</function>\n</tool_call>"
    )
    pieces = call.fragments()
    assert pieces[0][1] == "shell" and all(p[1] is None for p in pieces[1:])
    assert "".join(p[2] for p in pieces) == call.arguments_json
    assert json.loads(call.arguments_json) == call.arguments
    offsets = [p[0] for p in pieces]
    assert offsets == sorted(offsets) and offsets[-1] <= len(call.text)


def test_only_harmless_tools_are_called_and_tool_choice_rules() -> None:
    base = {"messages": _start()}
    assert plan_call({**base, "tools": chat_tools(WRITE, EDIT_PATH_ONLY)}) is None
    assert plan_call({**base, "tools": chat_tools(BASH), "tool_choice": "none"}) is None
    assert plan_call(base) is None
    named = {"type": "function", "function": {"name": "Read"}}
    call = plan_call({**base, "tools": chat_tools(BASH, READ), "tool_choice": named})
    assert call is not None and call.name == "Read"
    check_arguments(call.name, call.arguments)
    for tools in (chat_tools(BASH), chat_tools(SHELL), chat_tools(READ)):
        call = plan_call({**base, "tools": tools})
        assert call is not None
        check_arguments(call.name, call.arguments)
    # a conversation full of results still calls when the choice forces it
    results = [{"role": "tool", "tool_call_id": "x", "content": "ok"}] * 5
    forced = {"messages": [*_start(), *results], "tools": chat_tools(BASH)}
    assert plan_call(forced) is None
    assert plan_call({**forced, "tool_choice": "required"}) is not None


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_tool_call(worker: Worker, stream: bool) -> None:
    body = _chat_body(_start(), stream=stream)
    if not stream:
        status, out = await worker.post("/v1/chat/completions", body)
        assert status == 200, out
        choice = out["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and choice["matched_stop"] is None
        message = choice["message"]
        assert message["content"] == "" and message["reasoning_content"] is None
        (call,) = message["tool_calls"]
        assert call["id"].startswith(CALL_ID) and len(call["id"]) == len(CALL_ID) + 24
        assert call["index"] == 0 and call["type"] == "function"
        check_arguments(call["function"]["name"], json.loads(call["function"]["arguments"]))
        return
    events = await worker.sse("/v1/chat/completions", body)
    chunks = [e for e in events[:-1] if e["choices"]]
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks
             if "tool_calls" in c["choices"][0]["delta"]]  # fmt: skip
    assert calls[0]["id"].startswith(CALL_ID) and calls[0]["function"]["name"]
    assert all(c["id"] is None and c["function"]["name"] is None for c in calls[1:])
    arguments = "".join(c["function"]["arguments"] for c in calls)
    check_arguments(calls[0]["function"]["name"], json.loads(arguments))
    assert not any(c["choices"][0]["delta"].get("content") for c in chunks)
    last = chunks[-1]["choices"][0]
    assert last["finish_reason"] == "tool_calls" and last["matched_stop"] == 2
    _, whole = await worker.post("/v1/chat/completions", {**body, "stream": False})
    assert whole["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == arguments


async def test_no_call_without_tools_with_none_or_with_ignore_eos(worker: Worker) -> None:
    for body in (
        {"messages": _start()},
        _chat_body(_start(), tool_choice="none"),
        _chat_body(_start(), ignore_eos=True, max_tokens=300),
    ):
        _, out = await worker.post("/v1/chat/completions", body)
        assert "tool_calls" not in out["choices"][0]["message"]
        assert out["choices"][0]["finish_reason"] in ("stop", "length")
    _, out = await worker.post("/v1/chat/completions", _chat_body(_start(), max_tokens=5))
    assert "tool_calls" not in out["choices"][0]["message"]  # a call that does not fit is not made


@pytest.mark.parametrize("stream", [False, True])
async def test_messages_tool_use(worker: Worker, stream: bool) -> None:
    body = {"model": "m", "max_tokens": 32000, "system": SYSTEM, "stream": stream,
            "messages": [{"role": "user", "content": TASK}],
            "tools": anthropic_tools(BASH, READ, WRITE)}  # fmt: skip
    if not stream:
        _, out = await worker.post("/v1/messages", body)
        assert out["stop_reason"] == "tool_use"
        (block,) = out["content"]
        assert block["type"] == "tool_use" and block["id"].startswith(CALL_ID)
        check_arguments(block["name"], block["input"])
        return
    events = await worker.sse("/v1/messages", body)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    start = next(e for e in events if e["type"] == "content_block_start")
    assert start["content_block"]["type"] == "tool_use" and start["content_block"]["input"] == {}
    parts = [e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta"]
    check_arguments(start["content_block"]["name"], json.loads("".join(parts)))
    assert kinds.count("content_block_stop") == 1
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


@pytest.mark.parametrize("stream", [False, True])
async def test_responses_function_call(worker: Worker, stream: bool) -> None:
    body = {"model": "m", "instructions": SYSTEM, "input": TASK, "stream": stream,
            "tools": responses_tools(SHELL, WRITE)}  # fmt: skip
    if not stream:
        _, out = await worker.post("/v1/responses", body)
        assert out["status"] == "completed"
        (item,) = out["output"]
        assert item["type"] == "function_call" and item["status"] == "completed"
        assert item["call_id"].startswith(CALL_ID) and item["id"].startswith("fc_")
        check_arguments(item["name"], json.loads(item["arguments"]))
        return
    events = await worker.sse("/v1/responses", body)
    kinds = [e["type"] for e in events]
    added = events[kinds.index("response.output_item.added")]["item"]
    assert added["type"] == "function_call" and added["status"] == "in_progress"
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    done = events[kinds.index("response.function_call_arguments.done")]
    assert done["arguments"] == "".join(deltas) and done["name"] == added["name"]
    item = events[kinds.index("response.output_item.done")]["item"]
    assert item["status"] == "completed" and item["id"] == added["id"]
    final = events[-1]["response"]
    assert kinds[-1] == "response.completed" and final["output"] == [item]
    check_arguments(item["name"], json.loads(item["arguments"]))


def test_a_follow_up_carrying_the_call_extends_the_prompt_and_the_answer() -> None:
    tok = load_tokenizer(None, QWEN3_CODER_TEMPLATE)
    body = _chat_body(_start())
    prompt = chat_prompt_ids(tok, body)
    call = plan_call(body)
    assert call is not None
    answer = make_answer(tok, prompt, 32000, None, True, call=call)
    assert answer.call == call
    carried = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": call.name, "arguments": call.arguments_json}}]}  # fmt: skip
    result = {"role": "tool", "tool_call_id": "call_1", "content": "README.md"}
    follow = chat_prompt_ids(tok, _chat_body([*_start(), carried, result]))
    emitted = prompt + list(answer.output_ids)
    assert follow[: len(emitted)] == emitted


@dataclass
class Turn:
    prompt: int
    answer: int
    cached: int
    called: bool


async def _chat_turn(w: Worker, messages: list[Json]) -> Turn:
    _, out = await w.post("/v1/chat/completions", _chat_body(messages))
    message = out["choices"][0]["message"]
    for call in message.get("tool_calls") or []:
        check_arguments(call["function"]["name"], json.loads(call["function"]["arguments"]))
        result = {"role": "tool", "tool_call_id": call["id"], "content": "README.md"}
        messages += [{"role": "assistant", "content": "", "tool_calls": [call]}, result]
    u = out["usage"]
    cached = u["prompt_tokens_details"]["cached_tokens"]
    return Turn(u["prompt_tokens"], u["completion_tokens"], cached, bool(message.get("tool_calls")))


async def _messages_turn(w: Worker, messages: list[Json]) -> Turn:
    body = {"model": "m", "max_tokens": 32000, "system": SYSTEM, "messages": messages,
            "tools": anthropic_tools(BASH, READ)}  # fmt: skip
    _, out = await w.post("/v1/messages", body)
    uses = [b for b in out["content"] if b["type"] == "tool_use"]
    for block in uses:
        check_arguments(block["name"], block["input"])
        messages += [{"role": "assistant", "content": out["content"]},
                     {"role": "user", "content": [{"type": "tool_result",
                      "tool_use_id": block["id"], "content": "README.md"}]}]  # fmt: skip
    u = out["usage"]
    cached = u.get("cache_read_input_tokens", 0)
    return Turn(u["input_tokens"] + cached, u["output_tokens"], cached, bool(uses))


async def _responses_turn(w: Worker, state: list[Json]) -> Turn:
    body: Json = {"model": "m", "instructions": SYSTEM, "tools": responses_tools(SHELL)}
    if state:  # the history is the worker's: previous_response_id and the tool's output
        body |= {"previous_response_id": state[-1]["id"], "input": state[-1]["input"]}
    else:
        body["input"] = TASK
    _, out = await w.post("/v1/responses", body)
    calls = [i for i in out["output"] if i["type"] == "function_call"]
    for item in calls:
        check_arguments(item["name"], json.loads(item["arguments"]))
    output = [{"type": "function_call_output", "call_id": i["call_id"], "output": "README.md"}
              for i in calls]  # fmt: skip
    state.append({"id": out["id"], "input": output})
    u = out["usage"]
    cached = u["input_tokens_details"]["cached_tokens"]
    return Turn(u["input_tokens"], u["output_tokens"], cached, bool(calls))


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
async def test_an_agent_loop_ends_with_text_and_follow_ups_hit_the_previous_turn(
    agent_worker: Worker, api: str
) -> None:
    turn = {"chat": _chat_turn, "messages": _messages_turn, "responses": _responses_turn}[api]
    state: list[Json] = (
        [{"role": "user", "content": TASK}] if api == "messages"
        else _start() if api == "chat" else []
    )  # fmt: skip
    kinds = []
    previous: Turn | None = None
    for _ in range(5):
        now = await turn(agent_worker, state)
        kinds.append(now.called)
        if previous is not None:  # the previous prompt and answer are cached, whole pages
            assert now.cached >= (previous.prompt + previous.answer) // PAGE * PAGE
        previous = now
        if not now.called:
            break
    assert kinds[-1] is False and 1 <= kinds.count(True) <= 3, kinds
    assert all(kinds[:-1])
