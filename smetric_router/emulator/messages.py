"""The Anthropic Messages endpoints of SGLang 0.5.23 (entrypoints/anthropic/serving.py):
/v1/messages, streamed and not, and /v1/messages/count_tokens.

SGLang serves a Messages request as the chat completion it converts it to; so does the emulator:
the body becomes SGLang's chat body (features/anthropic_messages.py, checked against SGLang's own
converter), whose prompt ids the emulator's chat path computes (emulator/chat.py). Replies are in
SGLang's Anthropic shapes: the message object (usage input_tokens = prompt - cached, and
cache_read_input_tokens = cached when there is a hit), the event stream message_start,
content_block_start / _delta / _stop, message_delta, message_stop (no [DONE]), and errors as
{"type": "error", "error": {"type", "message"}}. A tool call (emulator.tool_calls) is a tool_use
block, as SGLang reports the call its parser found (id `call_...`, stop_reason tool_use; streamed:
content_block_start with the block, an input_json_delta per piece the parser got whole).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import web

from smetric_router.emulator import server as srv
from smetric_router.emulator.answer import CallPieces
from smetric_router.emulator.chat import chat_prompt_ids
from smetric_router.emulator.errors import BadRequest, InternalError, json_response
from smetric_router.emulator.runner import EngineFailed, Tracked
from smetric_router.emulator.tool_calls import Call, call_id, plan_call
from smetric_router.features import anthropic_messages, anthropic_thinking
from smetric_router.features.errors import FeatureError

Json = dict[str, Any]
_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_TYPES = {400: "invalid_request_error", 500: "api_error", 503: "overloaded_error"}


def register(router: web.UrlDispatcher) -> None:
    router.add_post("/v1/messages", messages)
    router.add_post("/v1/messages/count_tokens", count_tokens)


def error(status: int, message: str, kind: str | None = None) -> web.Response:
    err = {"type": kind or _TYPES.get(status, "api_error"), "message": message}
    return json_response({"type": "error", "error": err}, status)


def _usage(t: Tracked, *, input_: bool, output: bool, zero_output: bool = False) -> Json:
    """SGLang's _anthropic_usage_from_openai."""
    u: Json = {}
    cached = t.cached_total
    if input_:
        u["input_tokens"] = max(len(t.input_ids) - cached, 0)
    if output:
        u["output_tokens"] = 0 if zero_output else t.n_out
    if input_ and cached:
        u["cache_read_input_tokens"] = cached
    return u


def _chat(em: srv.Emulator, body: Json) -> Json:
    inline = anthropic_messages.supports_inline_system(em.codec.template.source or "")
    try:
        chat = anthropic_messages.chat_body(body, inline)
    except FeatureError as exc:
        raise BadRequest(str(exc)) from exc
    if not chat["messages"]:
        raise BadRequest("Messages cannot be empty.")
    return chat


def _prompt(em: srv.Emulator, body: Json) -> tuple[list[int], Call | None]:
    """The prompt ids, and the call the answer is (if any): SGLang sends no ignore_eos here."""
    chat = _chat(em, body)
    return chat_prompt_ids(em.codec, chat), plan_call(chat)


def _max_tokens(body: Json) -> int:
    n = body.get("max_tokens")
    if type(n) is float and n.is_integer():
        n = int(n)
    if n is None:
        raise BadRequest("max_tokens: Field required")
    if type(n) is not int:
        raise BadRequest("max_tokens: Input should be a valid integer")
    if n <= 0:
        raise BadRequest("max_tokens: Value error, max_tokens must be positive")
    return n


async def messages(request: web.Request) -> web.StreamResponse:
    em = request.app[srv.EMULATOR]
    try:
        body = await srv._body(request)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest("model: Field required")
        n = _max_tokens(body)
        if anthropic_thinking.enables_reasoning(body):  # no reasoning parser here
            raise BadRequest(anthropic_thinking.REFUSAL)
        prompt, call = _prompt(em, body)
        sub = srv._Submission(em, body, prompt, n, end_turn=True, asked=True, call=call)
    except BadRequest as exc:
        return error(400, str(exc))
    except InternalError:
        return error(500, "Internal server error")
    except EngineFailed:
        return error(503, "Internal server error")
    t, answer = sub.t, sub.answer
    message_id = f"msg_{uuid.uuid4().hex}"
    tool_id = call_id()

    def called() -> Call | None:
        return answer.call if srv._openai_finish(t, answer) == "stop" else None

    def stop_reason() -> str:
        finish = "tool_calls" if called() else srv._openai_finish(t, answer) or "stop"
        return _STOP.get(finish, "end_turn")

    def tool_use(call: Call, arguments: Json) -> Json:
        return {"type": "tool_use", "id": tool_id, "name": call.name, "input": arguments}

    def whole() -> Json:
        call = called()
        content = ([tool_use(call, call.arguments)] if call is not None
                   else [{"type": "text", "text": answer.text_at(t.n_out)}])  # fmt: skip
        return {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "content": content,
            "model": model,
            "stop_reason": stop_reason(),
            "usage": _usage(t, input_=True, output=True),
        }

    pieces = CallPieces(answer)

    def call_events() -> list[tuple[str, Json]]:
        """The events of the call's pieces its parser got whole by now, not yet sent."""
        out: list[tuple[str, Json]] = []
        if answer.call is None:
            return out
        for name, delta in pieces.new(t.n_out):
            if name is not None:
                out.append(("content_block_start", {"type": "content_block_start", "index": 0,
                            "content_block": tool_use(answer.call, {})}))  # fmt: skip
            if delta:
                piece = {"type": "input_json_delta", "partial_json": delta}
                event = {"type": "content_block_delta", "index": 0, "delta": piece}
                out.append(("content_block_delta", event))
        return out

    async def events() -> AsyncIterator[tuple[str, Json]]:
        started = opened = False
        sent = 0  # tokens whose text was sent
        async for _ in srv._progress(t):
            if t.error_status is not None:
                break
            text = "" if answer.call is not None else answer.text_between(sent, t.n_out)
            sent = t.n_out
            call_parts = call_events()
            if not started and (text or call_parts or t.done):
                head = {"id": message_id, "type": "message", "role": "assistant",
                        "content": [], "model": model,
                        "usage": _usage(t, input_=True, output=True, zero_output=True)}  # fmt: skip
                yield "message_start", {"type": "message_start", "message": head}
                started = True
            for part in call_parts:
                opened = True
                yield part
            if text:
                if not opened:
                    block = {"type": "text", "text": ""}
                    yield "content_block_start", {"type": "content_block_start", "index": 0,
                                                  "content_block": block}  # fmt: skip
                    opened = True
                delta = {"type": "text_delta", "text": text}
                yield "content_block_delta", {"type": "content_block_delta", "index": 0,
                                              "delta": delta}  # fmt: skip
        if t.error_status is not None:
            if not started:
                yield "message_start", {"type": "message_start", "message": {
                    "id": message_id, "type": "message", "role": "assistant", "content": [],
                    "model": model, "usage": {"input_tokens": 0, "output_tokens": 0}}}  # fmt: skip
            if opened:
                yield "content_block_stop", {"type": "content_block_stop", "index": 0}
            err = {"type": "api_error", "message": "Internal server error"}
            yield "error", {"type": "error", "error": err}
            yield "message_stop", {"type": "message_stop"}
            return
        if opened:
            yield "content_block_stop", {"type": "content_block_stop", "index": 0}
        end = {"type": "message_delta", "delta": {"stop_reason": stop_reason()},
               "usage": _usage(t, input_=False, output=True)}  # fmt: skip
        yield "message_delta", end
        yield "message_stop", {"type": "message_stop"}

    streamed = (lambda: _sse(request, events())) if body.get("stream") is True else None
    return await srv.answer(
        request, sub, streamed, whole, lambda: error(t.error_status or 500, "Internal server error")
    )


async def _sse(request: web.Request, events: AsyncIterator[tuple[str, Json]]) -> web.StreamResponse:
    """Anthropic's stream: named events, no [DONE]."""
    frames = (b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
              async for name, data in events)  # fmt: skip
    return await srv.write_sse(request, frames)


async def count_tokens(request: web.Request) -> web.Response:
    em = request.app[srv.EMULATOR]
    try:
        body = await srv._body(request)
        if not isinstance(body.get("model"), str):
            raise BadRequest("model: Field required")
        return json_response({"input_tokens": len(chat_prompt_ids(em.codec, _chat(em, body)))})
    except BadRequest as exc:
        return error(400, str(exc))
    except InternalError:
        return error(500, "Internal server error")
