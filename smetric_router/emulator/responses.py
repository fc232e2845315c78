"""The OpenAI Responses endpoints of SGLang 0.5.23 (entrypoints/openai/serving_responses.py,
started with --enable-response-store): POST /v1/responses streamed and not, GET
/v1/responses/{id}, POST /v1/responses/{id}/cancel.

SGLang serves a Responses request as the chat completion it converts it to; so does the
emulator: the body (after the stored history of previous_response_id: its input items and
output) becomes SGLang's chat body (features/openai_responses.py, checked against SGLang's own
converter), whose prompt ids the emulator's chat path computes. Replies are in SGLang's shapes:
the response object (status completed, or incomplete with reason max_output_tokens; usage with
input_tokens_details.cached_tokens), the event stream response.created / in_progress,
output_item.added, content_part.added, output_text.delta..., output_text.done,
content_part.done, output_item.done, response.completed | incomplete (no [DONE]); errors as
{"error": {"message", "type", "param", "code"}}. Responses with store (the default) are kept in
memory, at most STORE_LIMIT per worker, the oldest evicted first (SGLang keeps them all: a
worker that runs for long would grow without bound); `store: false` ones are not kept, and
background requests are refused. A tool call (emulator.tool_calls, function tools only) is a
function_call output item (call_id `call_...`, id `fc_...`), streamed as output_item.added,
function_call_arguments.delta per piece SGLang's parser got whole, .done, output_item.done; the
stored history keeps it, so a previous_response_id chain renders the call as SGLang would.
"""

from __future__ import annotations

import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import web

from smetric_router.emulator import server as srv
from smetric_router.emulator.answer import CallPieces
from smetric_router.emulator.chat import chat_prompt_ids
from smetric_router.emulator.config import DEFAULT_OPENAI_MAX_TOKENS
from smetric_router.emulator.errors import BadRequest, InternalError, json_response
from smetric_router.emulator.runner import EngineFailed
from smetric_router.emulator.tool_calls import Call, call_id, plan_call
from smetric_router.features import anthropic_messages, openai_responses
from smetric_router.features.errors import FeatureError

Json = dict[str, Any]
STORE_LIMIT = 4096
_HEADROOM = 2  # SGLang leaves max_output_tokens - 2 to generate (BOS/EOS headroom)
_TOOL_KEYS = ("type", "name", "description", "parameters", "strict", "tools", "defer_loading",
              "format")  # fmt: skip


class _Store:
    """Stored responses and the conversation each continues from (SGLang's response_store and
    msg_store), oldest first."""

    def __init__(self) -> None:
        self.items: OrderedDict[str, tuple[Json, list[Any]]] = OrderedDict()

    def put(self, response: Json, history: list[Any]) -> None:
        self.items[response["id"]] = (response, history)
        while len(self.items) > STORE_LIMIT:
            self.items.popitem(last=False)


_STORES: weakref.WeakKeyDictionary[srv.Emulator, _Store] = weakref.WeakKeyDictionary()


def _store(request: web.Request) -> _Store:
    em = request.app[srv.EMULATOR]
    store = _STORES.get(em)
    if store is None:
        store = _STORES[em] = _Store()
    return store


def register(router: web.UrlDispatcher) -> None:
    router.add_post("/v1/responses", create)
    router.add_get("/v1/responses/{response_id}", retrieve)
    router.add_post("/v1/responses/{response_id}/cancel", retrieve)  # nothing runs in background


def error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None
          ) -> web.Response:  # fmt: skip
    err = {"message": message, "type": kind, "param": param, "code": status}
    return json_response({"error": err}, status)


def _invalid_id(response_id: str) -> web.Response:
    msg = f"Invalid 'response_id': '{response_id}'. Expected an ID that begins with 'resp'."
    return error(400, msg, param="response_id")


def _not_found(response_id: str) -> web.Response:
    return error(404, f"Response with id '{response_id}' not found.", param="response_id")


async def retrieve(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    if not response_id.startswith("resp_"):
        return _invalid_id(response_id)
    found = _store(request).items.get(response_id)
    if found is None:
        return _not_found(response_id)
    return json_response(found[0])


def _max_tokens(body: Json) -> tuple[int, bool]:
    n = body.get("max_output_tokens")
    if n is None:
        return DEFAULT_OPENAI_MAX_TOKENS, False  # a modest synthetic answer, as for chat
    if type(n) is not int:
        raise BadRequest("max_output_tokens: Input should be a valid integer", validation=True)
    return max(n - _HEADROOM, 0), True


def _tool(tool: object) -> object:
    if not isinstance(tool, dict):
        return tool
    out = {k: tool.get(k) for k in _TOOL_KEYS}
    out["strict"] = bool(tool.get("strict") or False)
    return out


def _base(body: Json, rid: str, model: object, created: int) -> Json:
    """The response object as SGLang's ResponsesResponse.from_request builds it."""
    given = body.get("reasoning")
    reasoning: Json = given if isinstance(given, dict) else {}
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "model": model,
        "output": [],
        "status": "in_progress",
        "usage": None,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": [_tool(t) for t in body.get("tools") or []],
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "store": body.get("store", True),
        "temperature": body.get("temperature"),
        "text": body.get("text"),
        "top_p": body.get("top_p"),
        "truncation": body.get("truncation", "disabled"),
        "user": body.get("user"),
        "metadata": body.get("metadata") or {},
    }


async def create(request: web.Request) -> web.StreamResponse:
    em = request.app[srv.EMULATOR]
    store = _store(request)
    try:
        body = await srv._body(request)
        if "input" not in body:
            raise BadRequest("input: Field required", validation=True)
        if body.get("background"):
            return error(400, "background requests are not supported by the emulator")
        history: list[Any] = []
        prev = body.get("previous_response_id")
        if prev is not None:
            if not isinstance(prev, str) or not prev.startswith("resp_"):
                return _invalid_id(str(prev))
            found = store.items.get(prev)
            if found is None:
                return _not_found(prev)
            history = list(found[1])
        given = body["input"]
        history += [{"role": "user", "content": given}] if isinstance(given, str) else given
        inline = anthropic_messages.supports_inline_system(em.codec.template.source or "")
        try:
            chat = openai_responses.chat_body({**body, "input": history}, inline)
        except FeatureError as exc:
            raise BadRequest(str(exc)) from exc
        if not chat["messages"]:
            raise BadRequest("Cannot apply chat template to an empty conversation.")
        n, asked = _max_tokens(body)
        prompt = chat_prompt_ids(em.codec, chat)
        functions = [t.get("name") for t in body.get("tools") or []
                     if isinstance(t, dict) and t.get("type") == "function"]  # fmt: skip
        call = plan_call(chat, allowed=[f for f in functions if isinstance(f, str)])
        sub = srv._Submission(em, body, prompt, n, True, asked, open_ended=True, call=call)
    except BadRequest as exc:
        if exc.validation:
            return error(400, str(exc), "Bad Request")
        return error(400, str(exc))
    except InternalError:
        return error(500, "Internal server error", "InternalServerError")
    except EngineFailed:
        return error(503, "Internal server error", "ServiceUnavailable")
    t, answer = sub.t, sub.answer
    model = body.get("model") or srv.DEFAULT_REQUEST_MODEL
    rid = f"resp_{uuid.uuid4().hex}"
    item_id = f"msg_{uuid.uuid4().hex}"
    fc_id = f"fc_{uuid.uuid4().hex[:8]}"
    tool_id = call_id()
    created = int(time.time())

    def called() -> Call | None:
        return answer.call if srv._openai_finish(t, answer) == "stop" else None

    def function_call(call: Call, arguments: str, status: str) -> Json:
        return {"arguments": arguments, "call_id": tool_id, "name": call.name,
                "type": "function_call", "id": fc_id, "status": status}  # fmt: skip

    def part(text: str) -> Json:
        return {"annotations": [], "text": text, "type": "output_text", "logprobs": None}

    def item(text: str | None) -> Json:
        return {"id": item_id, "content": [] if text is None else [part(text)],
                "role": "assistant", "status": "in_progress" if text is None else "completed",
                "type": "message", "phase": "final_answer"}  # fmt: skip

    def final() -> Json:
        out = _base(body, rid, model, created)
        cut = srv._openai_finish(t, answer) == "length"
        call = called()
        if call is not None:
            out["output"] = [function_call(call, call.arguments_json, "completed")]
        else:
            out["output"] = [item(answer.text_at(t.n_out))]
        out["status"] = "incomplete" if cut else "completed"
        out["incomplete_details"] = {"reason": "max_output_tokens"} if cut else None
        out["usage"] = {
            "input_tokens": len(t.input_ids),
            "input_tokens_details": {"cached_tokens": t.cached_total, "cache_write_tokens": 0},
            "output_tokens": t.n_out,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": len(t.input_ids) + t.n_out,
        }
        out["text"] = body.get("text") or {"format": {"type": "text"}}
        if body.get("store", True) is not False:
            store.put(out, history + out["output"])
        return out

    async def events() -> AsyncIterator[Json]:
        head = _base(body, rid, model, created)
        yield {"type": "response.created", "response": head}
        yield {"type": "response.in_progress", "response": head}
        opened = False
        sent = 0
        where = {"item_id": item_id, "output_index": 0}
        pieces = CallPieces(answer)
        arguments = ""
        async for _ in srv._progress(t):
            if t.error_status is not None:
                break
            if answer.call is not None:
                for name, delta in pieces.new(t.n_out):
                    if name is not None:
                        added = function_call(answer.call, "", "in_progress")
                        yield {"item": added, "output_index": 0,
                               "type": "response.output_item.added"}  # fmt: skip
                    if delta:
                        arguments += delta
                        yield {"delta": delta, "item_id": fc_id, "output_index": 0,
                               "type": "response.function_call_arguments.delta"}  # fmt: skip
                continue
            text = answer.text_between(sent, t.n_out)
            sent = t.n_out
            if text and not opened:
                yield {"item": item(None), "output_index": 0, "type": "response.output_item.added"}
                yield {"content_index": 0, **where, "part": part(""),
                       "type": "response.content_part.added"}  # fmt: skip
                opened = True
            if text:
                yield {"content_index": 0, "delta": text, **where, "logprobs": [],
                       "type": "response.output_text.delta"}  # fmt: skip
        if t.error_status is not None:
            err = {"code": "server_error", "message": "Internal server error"}
            failed = {**head, "status": "failed", "error": err}
            yield {"type": "response.failed", "response": failed}
            return
        whole = answer.text_at(t.n_out)
        # the call's item, closed as SGLang's stream ends
        if pieces.shown and answer.call is not None:
            done = function_call(answer.call, arguments, "completed")
            yield {"arguments": arguments, "item_id": fc_id, "name": answer.call.name,
                   "output_index": 0, "type": "response.function_call_arguments.done"}  # fmt: skip
            yield {"item": done, "output_index": 0, "type": "response.output_item.done"}
        if opened:
            yield {"content_index": 0, **where, "logprobs": [], "text": whole,
                   "type": "response.output_text.done"}  # fmt: skip
            yield {"content_index": 0, **where, "part": part(whole),
                   "type": "response.content_part.done"}  # fmt: skip
            yield {"item": item(whole), "output_index": 0, "type": "response.output_item.done"}
        out = final()
        yield {"type": f"response.{out['status']}", "response": out}

    def failed() -> web.Response:
        return error(t.error_status or 500, "Internal server error", "InternalServerError")

    streamed = (lambda: _sse(request, events())) if body.get("stream") is True else None
    return await srv.answer(request, sub, streamed, final, failed)


async def _sse(request: web.Request, events: AsyncIterator[Json]) -> web.StreamResponse:
    """The Responses stream: events named by their type, numbered in order."""

    async def frames() -> AsyncIterator[bytes]:
        seq = 0
        async for data in events:
            data["sequence_number"] = seq
            seq += 1
            yield b"event: " + data["type"].encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    return await srv.write_sse(request, frames())
