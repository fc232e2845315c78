"""The emulated worker's aiohttp app: SGLang 0.5.23's HTTP surface over an engine model.

Generation endpoints share one path: parse -> synthetic answer -> submit to the runner -> stream
progress (one SSE chunk per engine step that advanced the request) or wait for the end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hmac
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client.exposition import choose_encoder

from smetric_router.core.kv_events import KVCacheEvent
from smetric_router.core.port_file import bound_port
from smetric_router.emulator import loads as v1_loads
from smetric_router.emulator import messages, replies, responses
from smetric_router.emulator.answer import Answer, CallPieces, make_answer
from smetric_router.emulator.chat import chat_prompt_ids
from smetric_router.emulator.config import (
    DEFAULT_BOOTSTRAP_PORT,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_OPENAI_MAX_TOKENS,
    NOTICE,
    SGLANG_VERSION,
    EmulatorConfig,
)
from smetric_router.emulator.errors import (
    VALIDATION,
    BadRequest,
    InternalError,
    fastapi_errors,
    generate_error,
    json_response,
    openai_body,
    openai_error,
)
from smetric_router.emulator.faults import Faults
from smetric_router.emulator.kv_publisher import KvEventPublisher
from smetric_router.emulator.l3_events import L3Announcer
from smetric_router.emulator.metrics import make_registry
from smetric_router.emulator.mooncake_tier import MooncakeTier
from smetric_router.emulator.pd import (
    Handover,
    KvTransferError,
    Rooms,
    fetch_kv,
    make_bootstrap_app,
    parse_room,
    transfer_seconds,
)
from smetric_router.emulator.runner import DuplicateRid, EngineFailed, EngineRunner, Tracked
from smetric_router.emulator.tokenizer import WorkerTokenizer
from smetric_router.emulator.tool_calls import Call, call_id, plan_call
from smetric_router.engine.api import CachedTokens, EngineModel
from smetric_router.engine.timing import load_profile

log = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 20.0  # SGLANG_HEALTH_CHECK_TIMEOUT's default
KV_TRANSFER_FAILED = 500  # SGLang aborts a decode whose KV transfer failed as an internal error
GENERATION_PATHS = frozenset(
    {"/generate", "/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"}
)
# the emulated model (Qwen3-Coder) stands in for a worker started with this parser; its tool calls
# are answered in the shapes that parser gives (emulator.tool_calls)
TOOL_CALL_PARSER = "qwen3_coder"
DEFAULT_REQUEST_MODEL = "default"  # what SGLang echoes for an OpenAI request without "model"
SSE_TYPE = "text/event-stream; charset=utf-8"
_DIE_KEY = web.RequestKey("emulator_die_mid_stream", bool)
_NO_CONTENT_TYPE = web.ResponseKey("emulator_no_content_type", bool)  # SGLang sends no media type
Json = dict[str, Any]


class Emulator:
    """Everything one worker process holds; lives on the app under EMULATOR."""

    def __init__(
        self,
        config: EmulatorConfig,
        engine: EngineModel,
        codec: WorkerTokenizer,
        tier: MooncakeTier | None = None,
    ) -> None:
        self.config = config
        self.codec = codec
        self.tier = tier  # the engine's global tier on a real store (closed with the app)
        backend = None if tier is None else tier.storage_backend
        self.runner = EngineRunner(engine, config.speedup, self._publish, tier, backend)
        if tier is not None and config.mooncake.l3_kv_events:
            tier.announcer = L3Announcer(self._publish, config.engine.page_size)
        self.faults = Faults()
        self.registry = make_registry(self.runner, config.model_name)
        self.started = time.time()
        self.startup_s = 0.0  # seconds from construction to a running engine loop
        self._publisher: KvEventPublisher | None = None
        self.rooms = Rooms()  # PD prefill: KV offered to decode instances
        self._bootstrap: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None  # PD decode: fetches KV from prefills
        self._kv_bytes_per_token: int = load_profile(config.engine.profile)["model"][
            "kv_bytes_per_token"
        ]
        # SGLang's model_config.context_len: what prompts and max_tokens are checked against
        self.context_length = config.context_length or engine.load().max_total_num_tokens

    def _publish(self, events: list[KVCacheEvent]) -> None:
        if self._publisher is not None:
            self._publisher.publish(events)

    async def start(self) -> None:
        kv = self.config.kv_events()
        endpoint = None
        if kv is not None:
            self._publisher = KvEventPublisher(
                kv.endpoint, kv.replay_endpoint, kv.topic, kv.buffer_steps, kv.hwm, kv.binds
            )
            endpoint = self._publisher.endpoint  # as bound (a port 0 resolved)
        if self.config.role == "prefill":
            self._bootstrap = await start_server(
                make_bootstrap_app(self.rooms), self.config.host, self.config.bootstrap_port
            )
        elif self.config.role == "decode":
            self._http = aiohttp.ClientSession()
        self.runner.start()
        self.startup_s = time.time() - self.started
        log.info(
            "engine loop started; kv events: %s; disaggregation mode: %s",
            "off" if kv is None else f"{'bound' if kv.binds else 'connected'} {endpoint}",
            self.config.role,
        )

    def bound_ports(self) -> dict[str, int]:
        """After start(): the KV-event and bootstrap ports bound (as the OS chose them where 0
        was asked for), by name: kv_events, kv_events_replay, bootstrap."""
        out: dict[str, int] = {}
        pub = self._publisher
        if pub is not None:
            for name, endpoint in (("kv_events", pub.endpoint),
                                   ("kv_events_replay", pub.replay_endpoint)):  # fmt: skip
                if endpoint is not None and endpoint.startswith("tcp://"):
                    out[name] = int(endpoint.rpartition(":")[2])
        if self._bootstrap is not None:
            out["bootstrap"] = bound_port(self._bootstrap)
        return out

    def hand_over(self, room: int, t: Tracked) -> None:
        """PD prefill: the prompt's KV is ready; offer it to the decode side."""
        self.rooms.offer(Handover(room, len(t.input_ids), t.cached or CachedTokens()))

    async def receive_kv(self, host: str, port: int, room: int, n_prompt: int) -> CachedTokens:
        """PD decode: wait for room's KV from its prefill, then for the modelled transfer."""
        assert self._http is not None, "receive_kv on a worker that is not a decode instance"
        cfg = self.config
        handover = await fetch_kv(self._http, host, port, room, cfg.decode_kv_timeout_s)
        if handover.prompt_tokens != n_prompt:
            raise KvTransferError(
                f"bootstrap room {room} holds KV of {handover.prompt_tokens} prompt tokens, "
                f"this request has {n_prompt}"
            )
        seconds = transfer_seconds(n_prompt, self._kv_bytes_per_token, cfg.transfer_gbps)
        await asyncio.sleep(seconds / cfg.speedup)
        return handover.cached

    async def stop(self) -> None:
        await self.runner.stop()
        if self._bootstrap is not None:
            await self._bootstrap.cleanup()
            self._bootstrap = None
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._publisher is not None:
            self._publisher.close()
            self._publisher = None
        if self.tier is not None:
            # waits for calls in flight, then unmounts the segment from the master (~2 s)
            await asyncio.to_thread(self.tier.close)
            self.tier = None


EMULATOR = web.AppKey("emulator", Emulator)


# --- helpers -------------------------------------------------------------------------------------


async def _body(request: web.Request) -> Json:
    """The JSON object body; what FastAPI's request validation rejects is a validation error."""
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"JSON decode error: {exc}", validation=True) from exc
    except web.RequestPayloadError as exc:  # a body that fails its Content-Encoding
        raise BadRequest(
            f"JSON decode error: {' '.join(str(exc).split())}", validation=True
        ) from exc
    if not isinstance(body, dict):
        raise BadRequest("Input should be a valid dictionary", validation=True)
    return body


def _new_tokens(value: object, name: str, default: int, minimum: int) -> int:
    """A token budget: SGLang's sampling check says `at least 0`; the emulator's OpenAI answers
    need one token (minimum 1). A float without a fraction is taken, as pydantic's lax int."""
    if value is None:
        return default
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is not int:
        raise BadRequest(f"{name}: Input should be a valid integer", validation=True)
    if value < 0:
        raise BadRequest(f"{name} must be at least 0, got {value}.")
    if value < minimum:
        raise BadRequest(f"the emulator answers with at least {minimum} token ({name})")
    return value


def _temperature(params: Json) -> None:
    t = params.get("temperature")
    if t is None:
        return
    if type(t) not in (int, float) or not math.isfinite(t) or t < 0:
        raise BadRequest(f"temperature must be a non-negative finite number, got {t}.")


def _token_ids(value: object, name: str) -> list[int]:
    if not isinstance(value, list) or not all(type(i) is int and i >= 0 for i in value):
        raise BadRequest(f"{name} must be a list of token ids")
    if not value:
        raise BadRequest(f"{name} is empty")
    return value


async def _progress(t: Tracked) -> AsyncIterator[None]:
    """Yields whenever the request gained output or ended; several steps between two reads of a
    slow client coalesce into one."""
    sent = -1
    while True:
        await t.changed.wait()
        t.changed.clear()
        if t.done or t.n_out > sent:
            sent = t.n_out
            yield
            if t.done:
                return


async def _finished(t: Tracked) -> None:
    async for _ in _progress(t):
        pass


def _drop_connection(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.abort()


async def _sse(request: web.Request, events: AsyncIterator[Json]) -> web.StreamResponse:
    """OpenAI's stream: `data:` events, then [DONE]."""
    frames = (b"data: " + orjson.dumps(ev) + b"\n\n" async for ev in events)
    return await write_sse(request, frames, b"data: [DONE]\n\n")


async def write_sse(
    request: web.Request, frames: AsyncIterator[bytes], last: bytes = b""
) -> web.StreamResponse:
    """Write a stream of whole SSE frames, then `last`; an injected fault (`die`) cuts it after
    the first frame."""
    resp = web.StreamResponse(headers={"Content-Type": SSE_TYPE, "Cache-Control": "no-cache"})
    die = request.get(_DIE_KEY, False)
    try:
        await resp.prepare(request)
        async for frame in frames:
            await resp.write(frame)
            if die:
                _drop_connection(request)
                return resp
        if last:
            await resp.write(last)
        await resp.write_eof()
    except ConnectionResetError:
        # the client went away (mid-stream, or before the headers were out): the caller
        # releases the request, as SGLang aborts one whose client disconnects
        pass
    return resp


def _check_context(em: Emulator, n_prompt: int, max_new: int | None) -> None:
    """SGLang's tokenizer manager: the prompt must stay below the context length, and with the
    max_new_tokens the request sets (if any) within it."""
    context = em.context_length
    if n_prompt >= context:
        raise BadRequest(
            f"The input ({n_prompt} tokens) is longer than the model's context length "
            f"({context} tokens)."
        )
    if max_new is not None and n_prompt + max_new > context:
        raise BadRequest(
            f"Requested token count exceeds the model's maximum context length of {context} "
            f"tokens. You requested a total of {n_prompt + max_new} tokens: {n_prompt} tokens "
            f"from the input messages and {max_new} tokens for the completion. Please reduce "
            "the number of tokens in the input messages or the completion to fit within the "
            "limit."
        )


def _finish_reason(t: Tracked, answer: Answer) -> Json | None:
    if t.abort_message is not None:
        return {"type": "abort", "message": t.abort_message}
    if not t.finished:
        return None
    if answer.matched_stop is None:
        return {"type": "length", "length": t.n_out}
    return {"type": "stop", "matched": answer.matched_stop}


def _openai_finish(t: Tracked, answer: Answer) -> str | None:
    reason = _finish_reason(t, answer)
    return None if reason is None else str(reason["type"])


def _api_key_middleware(key: str) -> Middleware:
    """SGLang 0.5.23's --api-key check (srt/utils/auth.py): probes and metrics stay open."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != "OPTIONS" and not request.path.startswith(_OPEN_PREFIXES):
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                token.encode(errors="surrogateescape"), key.encode()
            ):
                return json_response({"error": "Unauthorized"}, 401)
        return await handler(request)

    return check


_OPEN_PREFIXES = ("/health", "/ready", "/metrics")


# --- fault injection ----------------------------------------------------------------------------


@web.middleware
async def _fault_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    if request.path not in GENERATION_PATHS:
        return await handler(request)
    faults = request.app[EMULATOR].faults
    status = faults.take_fail()
    if status is not None:
        return openai_error("injected fault: request refused", status, "ServiceUnavailable")
    await faults.wait_unstalled()
    request[_DIE_KEY] = faults.take_die()
    return await handler(request)


async def faults_handler(request: web.Request) -> web.Response:
    faults = request.app[EMULATOR].faults
    if request.method == "POST":
        try:
            faults.update(await _body(request))
        except ValueError as exc:
            return openai_error(str(exc), 400)
    return json_response(faults.state())


# --- generation ---------------------------------------------------------------------------------


def _pairing(body: Json, role: str) -> tuple[int, str, int]:
    """A PD request's bootstrap room and its prefill's bootstrap host and port."""
    try:
        room = parse_room(body.get("bootstrap_room"))
    except ValueError as exc:
        raise BadRequest(f"{role} instance: {exc}") from exc
    host, port = body.get("bootstrap_host"), body.get("bootstrap_port")
    if port is None:
        port = DEFAULT_BOOTSTRAP_PORT
    if role == "decode" and (not isinstance(host, str) or not host):
        raise BadRequest("decode instance: bootstrap_host must name the prefill's host")
    if type(port) is not int or not 0 < port < 65536:
        raise BadRequest("bootstrap_port must be a port number")
    return room, host if isinstance(host, str) else "", port


class _Submission:
    """A parsed generation request, submitted to the runner; released when the handler ends.

    PD: a prefill instance computes the prompt and answers with the first token only, offering
    the KV under the request's bootstrap room when its prefill finishes; a decode instance waits
    for that KV, then decodes the whole answer (the same one a colocated worker gives).
    """

    def __init__(
        self,
        em: Emulator,
        body: Json,
        prompt: list[int],
        max_tokens: int,
        end_turn: bool,
        asked: bool,
        *,
        natural: bool = True,
        open_ended: bool = False,
        call: Call | None = None,
    ) -> None:
        """asked: whether the request set its max tokens (SGLang checks the total only then);
        natural: the answer may end before max_tokens (no ignore_eos); open_ended: without a
        max set, a natural answer may run to the context's end (chat-like APIs, as SGLang's
        chat leaves max_tokens unset) rather than to the default max_tokens; call: the tool
        call the answer is, if it fits."""
        _check_context(em, len(prompt), max_tokens if asked else None)
        if natural and open_ended and not asked:
            max_tokens = em.context_length - len(prompt)
        user_rid = body.get("rid")
        if user_rid is not None and not isinstance(user_rid, str):
            raise BadRequest("rid: Input should be a valid string", validation=True)
        self.rid = user_rid or uuid.uuid4().hex
        priority = body.get("priority")
        if priority is not None and type(priority) is not int:
            raise BadRequest("priority: Input should be a valid integer", validation=True)
        self.answer = make_answer(
            em.codec, prompt, max_tokens, user_rid, end_turn, natural=natural, call=call
        )
        self.created = int(time.time())
        role, runner = em.config.role, em.runner
        try:
            if role == "prefill":
                room, _, _ = _pairing(body, role)
                if self.answer.output_ids:
                    self.answer = self.answer.first_token()
                withhold = em.faults.take_withhold()
                self.t = runner.submit(
                    self.rid,
                    prompt,
                    self.answer.output_ids,
                    on_finish=None if withhold else functools.partial(em.hand_over, room),
                    priority=priority,
                )
            elif role == "decode":
                room, host, port = _pairing(body, role)
                self.t = runner.submit_prefilled(
                    self.rid,
                    prompt,
                    self.answer.output_ids,
                    functools.partial(em.receive_kv, host, port, room, len(prompt)),
                    KV_TRANSFER_FAILED,
                    priority,
                )
            else:
                self.t = runner.submit(self.rid, prompt, self.answer.output_ids, priority=priority)
        except DuplicateRid as exc:
            raise BadRequest(str(exc)) from exc


def _error_body(message: str, status: int) -> Json:
    err_type = "InternalServerError" if status >= 500 else "BadRequestError"
    return openai_body(message, status, err_type)


async def _or_error(t: Tracked, events: AsyncIterator[Json]) -> AsyncIterator[Json]:
    """A request that failed as an error (PD: no KV) ends its stream with an error event, as
    SGLang's streaming handlers do, instead of an aborted chunk."""
    async for ev in events:
        if t.error_status is not None:
            break
        yield ev
    if t.error_status is not None:
        yield {"error": _error_body(t.abort_message or "request failed", t.error_status)}


async def _run(
    request: web.Request,
    sub: _Submission,
    stream: bool,
    chunks: Callable[[], AsyncIterator[Json]],
    whole: Callable[[], Json],
) -> web.StreamResponse:
    t = sub.t

    def failed() -> web.Response:
        body = _error_body(t.abort_message or "request failed", t.error_status or 500)
        wrapped = body if request.path != "/generate" else {"error": body}
        return json_response(wrapped, t.error_status or 500)

    streamed = (lambda: _sse(request, _or_error(t, chunks()))) if stream else None
    return await answer(request, sub, streamed, whole, failed)


async def answer(
    request: web.Request,
    sub: _Submission,
    streamed: Callable[[], Awaitable[web.StreamResponse]] | None,
    whole: Callable[[], Json],
    failed: Callable[[], web.Response],
) -> web.StreamResponse:
    """Answer a submitted request in its API's shapes: its stream, or once it has finished, the
    whole reply (`failed()` when it ended in an error); an injected death drops the connection.
    The runner's slot is released whichever way it ends."""
    try:
        if streamed is not None:
            return await streamed()
        if request.get(_DIE_KEY, False):
            _drop_connection(request)
            return web.Response()
        await _finished(sub.t)
        if sub.t.error_status is not None:
            return failed()
        return json_response(whole())
    finally:
        request.app[EMULATOR].runner.release(sub.rid)


def _generate_prompt(em: Emulator, body: Json) -> tuple[list[int], int, bool]:
    text, ids = body.get("text"), body.get("input_ids")
    if text is None and ids is None:
        raise BadRequest("Either text, input_ids or input_embeds should be provided.")
    if text is not None and ids is not None:
        raise BadRequest("Either text or input_ids should be provided, not both.")
    if text is not None and not isinstance(text, str):
        raise BadRequest("the emulator serves one prompt per request: text must be a string")
    prompt = em.codec.encode_prompt(text) if isinstance(text, str) else _token_ids(ids, "input_ids")
    if not prompt:  # "" tokenizes to nothing; the engine takes no empty prompt
        raise BadRequest("text is empty")
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise BadRequest("sampling_params: Input should be a valid dictionary", validation=True)
    _temperature(params)
    asked = params.get("max_new_tokens")
    n = _new_tokens(asked, "max_new_tokens", DEFAULT_MAX_NEW_TOKENS, 0)
    return prompt, n, asked is not None


def ignore_eos(value: object, validated: bool) -> bool:
    """SGLang's ignore_eos: a pydantic bool in the OpenAI bodies (validated), a value taken by
    its truth in /generate's sampling_params dict."""
    if not validated:
        return bool(value)
    if value is None or isinstance(value, bool):
        return bool(value)
    if type(value) is int and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _BOOL_WORDS:
        return _BOOL_WORDS[value.lower()]
    raise BadRequest("ignore_eos: Input should be a valid boolean", validation=True)


_BOOL_WORDS = dict.fromkeys(("true", "1", "yes", "on", "t", "y"), True) | dict.fromkeys(
    ("false", "0", "no", "off", "f", "n"), False
)


async def generate(request: web.Request) -> web.StreamResponse:
    em = request.app[EMULATOR]
    try:
        body = await _body(request)
        prompt, n, asked = _generate_prompt(em, body)
        natural = not ignore_eos((body.get("sampling_params") or {}).get("ignore_eos"), False)
        sub = _Submission(em, body, prompt, n, end_turn=False, asked=asked, natural=natural)
    except BadRequest as exc:
        return exc.response(generate=True)
    except EngineFailed as exc:
        return generate_error(str(exc), 503)
    t, answer = sub.t, sub.answer
    decode_role = em.config.role == "decode"

    def chunk(first: bool = True) -> Json:
        reason = _finish_reason(t, answer)
        meta = replies.meta_info(t, reason, first=first, final=t.done, decode_role=decode_role)
        text = answer.text_at(t.n_out)
        return {"text": text, "output_ids": answer.output_ids[: t.n_out], "meta_info": meta}

    async def chunks() -> AsyncIterator[Json]:
        first = True
        async for _ in _progress(t):
            yield chunk(first)
            first = False

    return await _run(request, sub, bool(body.get("stream")), chunks, chunk)


def _request_model(em: Emulator, body: Json) -> str:
    """The `model` SGLang echoes: any name is served (it routes no models); only the LoRA form
    `base:adapter` is refused, LoRA being off."""
    model = body.get("model", DEFAULT_REQUEST_MODEL)
    if not isinstance(model, str):
        raise BadRequest("model: Input should be a valid string", validation=True)
    served = em.config.model_name
    if ":" in model and model != served:
        prefix = f"{served}:" if model.startswith(f"{served}:") else model.split(":", 1)[0] + ":"
        adapter = model[len(prefix) :]
        if adapter.strip():
            raise BadRequest(
                f"LoRA adapter '{adapter.strip()}' was requested, but LoRA is not enabled. "
                "Please launch the server with --enable-lora flag and preload adapters "
                "using --lora-paths or /load_lora_adapter endpoint."
            )
    return model


def _openai_common(em: Emulator, body: Json, chat: bool) -> tuple[str, int, bool, bool, bool]:
    model = _request_model(em, body)
    if body.get("n") not in (None, 1):
        raise BadRequest("the emulator answers with one choice (n must be 1)")
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    if not chat and type(max_tokens) is int and max_tokens <= 0:
        raise BadRequest("max_tokens: Value error, max_tokens must be positive", validation=True)
    name = "max_new_tokens" if type(max_tokens) is int else "max_tokens"
    n = _new_tokens(max_tokens, name, DEFAULT_OPENAI_MAX_TOKENS, 1)
    if chat and max_tokens is not None and n > em.context_length:  # serving_chat's own check
        raise BadRequest(
            f"max_completion_tokens is too large: {n}.This model supports at most "
            f"{em.context_length} completion tokens."
        )
    options = body.get("stream_options") or {}
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    return model, n, bool(body.get("stream")), include_usage, max_tokens is not None


async def _openai(
    request: web.Request,
    parse_prompt: Callable[[Emulator, Json], list[int]],
    chat: bool,
) -> web.StreamResponse:
    em = request.app[EMULATOR]
    try:
        body = await _body(request)
        model, n, stream, include_usage, asked = _openai_common(em, body, chat)
        natural = not ignore_eos(body.get("ignore_eos"), True)
        prompt = parse_prompt(em, body)
        call = plan_call(body) if chat and natural else None
        sub = _Submission(em, body, prompt, n, chat, asked,
                          natural=natural, open_ended=chat, call=call)  # fmt: skip
    except (BadRequest, InternalError) as exc:
        return exc.response()
    except EngineFailed as exc:
        return openai_error(str(exc), 503, "ServiceUnavailable")
    t, answer = sub.t, sub.answer
    tool_id = call_id()
    details = bool(body.get("return_cached_tokens_details"))
    kind = "chat.completion" if chat else "text_completion"
    chunk_kind = "chat.completion.chunk" if chat else "text_completion"

    def head(object_: str) -> Json:
        return {"id": sub.rid, "object": object_, "created": sub.created, "model": model}

    def sglext() -> Json | None:
        d = replies.cached_details(t) if details else None
        return None if d is None else {"cached_tokens_details": d}

    def called() -> bool:
        """The answer is a whole call (SGLang's parser reports it, finish tool_calls)."""
        return answer.call is not None and _openai_finish(t, answer) == "stop"

    def choice(body_: Json, finish: bool = True, whole: bool = False) -> Json:
        c: Json = {"index": 0, **body_, "logprobs": None}
        c["finish_reason"] = _openai_finish(t, answer) if finish else None
        c["matched_stop"] = answer.matched_stop if finish and t.finished else None
        if finish and called():
            c["finish_reason"] = "tool_calls"
            if whole:  # the non-streamed reply drops the stop; the stream's last chunk keeps it
                c["matched_stop"] = None
        return c

    def tool_call(name: str | None, arguments: str, first: bool = True) -> Json:
        function = {"name": name, "arguments": arguments}
        return {"id": tool_id if first else None, "index": 0, "type": "function",
                "function": function}  # fmt: skip

    def whole() -> Json:
        text = answer.text_at(t.n_out)
        msg: Json = {"text": text}
        if chat and answer.call is not None and called():
            call = tool_call(answer.call.name, answer.call.arguments_json)
            msg = {"message": {"role": "assistant", "content": "", "reasoning_content": None,
                               "tool_calls": [call]}}  # fmt: skip
        elif chat:
            msg = {"message": {"role": "assistant", "content": text, "reasoning_content": None}}
        obj = {**head(kind), "choices": [choice(msg, whole=True)], "usage": replies.usage(t)}
        obj["metadata"] = replies.metadata(t)
        ext = sglext()
        if ext is not None:
            obj["sglext"] = ext
        return obj

    def delta(content: str | None, role: bool = False) -> Json:
        d: Json = {"reasoning_content": None}
        if role:
            d["role"] = "assistant"
        if content is not None:
            d["content"] = content
        return {"delta": d}

    def call_delta(name: str | None, arguments: str) -> Json:
        d = {"role": None, "content": None, "reasoning_content": None,
             "tool_calls": [tool_call(name, arguments, name is not None)]}  # fmt: skip
        return {**head(chunk_kind), "choices": [choice({"delta": d}, False)], "usage": None}

    async def chat_chunks() -> AsyncIterator[Json]:
        """SGLang's chat stream: a role chunk, then a content chunk per step that added text
        (for a call: a chunk per piece its parser got whole), then a chunk carrying only the
        finish reason."""
        sent: int | None = None  # tokens whose text was sent
        pieces = CallPieces(answer)
        async for _ in _progress(t):
            if sent is None:
                yield {**head(chunk_kind), "choices": [choice(delta("", role=True), False)]}
                sent = 0
            if answer.call is not None:
                for name, arguments in pieces.new(t.n_out):
                    yield call_delta(name, arguments)
            else:
                text = answer.text_between(sent, t.n_out)
                if text:
                    yield {**head(chunk_kind), "choices": [choice(delta(text), False)]}
            sent = t.n_out
            if t.done:
                yield {**head(chunk_kind), "choices": [choice(delta(None))]}

    async def completion_chunks() -> AsyncIterator[Json]:
        sent = 0  # tokens whose text was sent
        async for _ in _progress(t):
            text = answer.text_between(sent, t.n_out)
            yield {**head(chunk_kind), "choices": [choice({"text": text})],
                   "usage": None}  # fmt: skip
            sent = t.n_out

    async def chunks() -> AsyncIterator[Json]:
        async for c in chat_chunks() if chat else completion_chunks():
            yield c
        ext = sglext()
        if ext is not None:
            yield {**head(chunk_kind), "choices": [], "usage": None, "sglext": ext}
        if include_usage:
            yield {**head(chunk_kind), "choices": [], "usage": replies.usage(t, chat)}

    return await _run(request, sub, stream, chunks, whole)


def _chat_prompt(em: Emulator, body: Json) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise BadRequest("messages: Field required (a list)", validation=True)
    if not messages:
        raise BadRequest("messages must be a non-empty list")
    return chat_prompt_ids(em.codec, body)


def _completion_prompt(em: Emulator, body: Json) -> list[int]:
    prompt = body.get("prompt")
    if prompt is None:
        raise BadRequest("prompt: Field required", validation=True)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise BadRequest("prompt is empty")
        return em.codec.encode_prompt(prompt)
    return _token_ids(prompt, "prompt")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _openai(request, _chat_prompt, chat=True)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _openai(request, _completion_prompt, chat=False)


# --- health, info, admin ------------------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    """SGLang's health_generate: a one-token probe through the engine; any engine step finishing
    meanwhile also proves it alive (SGLang's last-receive rule), so a busy worker stays healthy."""
    em = request.app[EMULATOR]
    if not em.runner.running:
        return web.Response(status=503)
    rid = f"HEALTH_CHECK_{uuid.uuid4().hex}"
    probe = em.runner.submit(rid, [0], [em.codec.end_of_turn_id], counted=False)
    waits = [asyncio.ensure_future(_finished(probe)), asyncio.ensure_future(em.runner.next_step())]
    try:
        done, _ = await asyncio.wait(
            waits, timeout=HEALTH_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        for w in waits:
            w.cancel()
        em.runner.release(rid)
    return web.Response(status=200 if done and em.runner.running else 503)


async def ready(request: web.Request) -> web.Response:
    return web.Response(status=200 if request.app[EMULATOR].runner.running else 503)


def _kv_events_config(cfg: EmulatorConfig) -> str | None:
    """The --kv-events-config JSON as given (SGLang reports the raw flag value)."""
    if cfg.kv_events_config is not None:
        return cfg.kv_events_config
    kv = cfg.kv_events()
    return None if kv is None else kv.raw


def _server_info(em: Emulator) -> Json:
    cfg, ecfg = em.config, em.config.engine
    load = em.runner.engine.load()
    kv = cfg.kv_events()
    graphs = dict.fromkeys(
        ("prefill", "decode", "target_verify", "draft_prefill", "draft_decode", "draft_extend"), 0.0
    )
    return {
        "emulated": True,
        "emulator_notice": NOTICE,
        "model_path": cfg.model_name,
        "served_model_name": cfg.model_name,
        "tokenizer_path": cfg.tokenizer_path,
        "chat_template": cfg.chat_template,
        "tool_call_parser": TOOL_CALL_PARSER,
        "host": cfg.host,
        "port": cfg.port,
        "page_size": ecfg.page_size,
        "chunked_prefill_size": ecfg.chunked_prefill_size,
        "max_running_requests": ecfg.max_running_requests,
        "max_total_num_tokens": load.max_total_num_tokens,
        "max_req_input_len": load.max_total_num_tokens,
        "context_length": cfg.context_length,
        "enable_hierarchical_cache": ecfg.host_kv_tokens > 0,
        "hicache_storage_backend": None if em.tier is None else "mooncake",
        "emulator_global_tier": None if em.tier is None else _tier_info(em.tier),
        "emulator_host_kv_tokens": ecfg.host_kv_tokens,
        "emulator_profile": ecfg.profile,
        "emulator_speedup": cfg.speedup,
        "tp_size": 1,
        "dp_size": 1,
        "disaggregation_mode": cfg.role,
        "disaggregation_bootstrap_port": cfg.bootstrap_port,
        "disaggregation_transfer_backend": "emulated",
        "emulator_transfer_gbps": cfg.transfer_gbps,
        "emulator_decode_kv_timeout_secs": cfg.decode_kv_timeout_s,
        "enable_cache_report": True,
        "enable_metrics": True,
        "weight_version": replies.WEIGHT_VERSION,
        "kv_events_config": _kv_events_config(cfg),
        "kv_events": None if kv is None else kv.descriptor(ecfg.page_size),
        "internal_states": [
            {
                "effective_max_running_requests_per_dp": ecfg.max_running_requests,
                "last_gen_throughput": load.gen_throughput,
            }
        ],
        "version": SGLANG_VERSION,
        # SGLang's startup phase durations in seconds; nothing is loaded or captured here
        "startup_time": {
            "load_weight": 0.0,
            "kv_cache_allocation": 0.0,
            "scheduler_e2e": 0.0,
            "cuda_graph": graphs,
            "tokenizer_e2e": em.startup_s,
        },
    }


def _tier_info(tier: MooncakeTier) -> Json:
    return {"backend": "mooncake", "up": tier.up, **dataclasses.asdict(tier.stats)}


async def server_info(request: web.Request) -> web.Response:
    return json_response(_server_info(request.app[EMULATOR]))


async def model_info(request: web.Request) -> web.Response:
    cfg = request.app[EMULATOR].config
    return json_response(
        {
            "model_path": cfg.model_name,
            "served_model_name": cfg.model_name,
            "tokenizer_path": cfg.tokenizer_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": replies.WEIGHT_VERSION,
            "load_format": "auto",
            "reasoning_parser": None,
            "tool_call_parser": TOOL_CALL_PARSER,
            "disaggregation_mode": cfg.role,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            # the model the timing profiles describe (Qwen3-Coder-30B-A3B)
            "model_type": "qwen3_moe",
            "architectures": ["Qwen3MoeForCausalLM"],
            "emulated": True,
            "emulator_notice": NOTICE,
        }
    )


async def models(request: web.Request) -> web.Response:
    em = request.app[EMULATOR]
    card = {
        "id": em.config.model_name,
        "object": "model",
        "created": int(em.started),
        "owned_by": "sglang-emulator",
        "root": em.config.model_name,
        "parent": None,
        "max_model_len": em.context_length,
    }
    return json_response({"object": "list", "data": [card]})


async def loads(request: web.Request) -> web.Response:
    em = request.app[EMULATOR]
    rank = request.query.get("dp_rank")
    if rank is not None and not rank.lstrip("-").isdigit():
        return openai_error("dp_rank: Input should be a valid integer", 400, VALIDATION)
    raw = request.query.get("include")
    include = {s.strip() for s in raw.split(",")} if raw else None
    try:
        entry = v1_loads.entry(em.config, em.runner, include)
    except v1_loads.InvalidInclude:
        # SGLang 0.5.23 raises this past its handler: a bare 500 (kept as SGLang answers it)
        return web.Response(status=500, text="Internal Server Error")
    entries = [entry] if rank is None or int(rank) == 0 else []  # dp_size 1: only rank 0
    if request.query.get("format") == "prometheus":
        return web.Response(
            text=v1_loads.prometheus(entries), headers={"Content-Type": v1_loads.PROMETHEUS_TYPE}
        )
    return json_response(v1_loads.response(entries))


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text, negotiated from Accept like SGLang's prometheus_client ASGI app
    (0.0.4 text format without an Accept header)."""
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    body = encoder(request.app[EMULATOR].registry)
    return web.Response(body=body, headers={"Content-Type": content_type})


def _bare_text(text: str, status: int = 200) -> web.Response:
    """A text body without Content-Type, as SGLang's plain `Response(content=...)` sends it."""
    resp = web.Response(body=text.encode(), status=status)
    resp[_NO_CONTENT_TYPE] = True
    return resp


async def _drop_content_type(request: web.Request, response: web.StreamResponse) -> None:
    if response.get(_NO_CONTENT_TYPE):
        response.headers.popall("Content-Type", None)


async def flush_cache(request: web.Request) -> web.Response:
    try:
        timeout = float(request.query.get("timeout", "0"))
        if not timeout >= 0:
            raise ValueError(timeout)
    except ValueError:
        message = "timeout: Input should be a number greater than or equal to 0"
        return openai_error(message, 400, VALIDATION)
    if await request.app[EMULATOR].runner.flush(timeout):
        return _bare_text(
            "Cache flushed.\nPlease check backend logs for more details. (When there are running "
            "or waiting requests, the operation will not be performed.)\n"
        )
    return _bare_text("Cache not flushed: requests are running or waiting.\n", 400)


async def clear_storage_backend(request: web.Request) -> web.Response:
    """SGLang's POST /hicache/storage-backend/clear: empties the global tier (the whole Mooncake
    store); 400 with SGLang's text when there is none or the master does not do it."""
    tier = request.app[EMULATOR].tier
    ok = tier is not None and await tier.clear()
    return _bare_text("Hierarchical cache storage backend cleared.\n", 200 if ok else 400)


async def abort_request(request: web.Request) -> web.Response:
    runner = request.app[EMULATOR].runner
    try:
        body = await _body(request)
    except BadRequest as exc:
        return exc.response()
    if body.get("abort_all"):
        runner.abort_all()
    elif isinstance(body.get("rid"), str):
        runner.abort(body["rid"])
    return web.Response()


async def prefix_match(request: web.Request) -> web.Response:
    """The patched SGLang's POST /smetric/prefix_match (patches/): per prompt, tokens of the leading
    page-aligned prefix on the GPU (`device`) and on the GPU or host (`host`). Read-only; it runs on
    the event loop between engine steps, as SGLang answers it between forward steps."""
    em = request.app[EMULATOR]
    try:
        body = await _body(request)
    except BadRequest as exc:
        return json_response({"error": {"message": str(exc)}}, 400)
    prompts = body.get("input_ids")
    if isinstance(prompts, list) and all(type(t) is int for t in prompts):
        prompts = [prompts]
    if not isinstance(prompts, list) or not all(
        isinstance(p, list) and all(type(t) is int for t in p) for p in prompts
    ):
        message = "input_ids must be a list of ints or of int lists"
        return json_response({"error": {"message": message}}, 400)
    if em.faults.probe_delay_secs:
        await asyncio.sleep(em.faults.probe_delay_secs)
    results = []
    for ids in prompts:
        cached = em.runner.engine.match_prefix(ids)
        results.append({"device": cached.device, "host": cached.device + cached.host})
    return json_response({"page_size": em.config.engine.page_size, "results": results})


def make_app(
    config: EmulatorConfig,
    engine: EngineModel,
    codec: WorkerTokenizer,
    tier: MooncakeTier | None = None,
) -> web.Application:
    auth = [_api_key_middleware(config.api_key)] if config.api_key is not None else []
    app = web.Application(
        middlewares=[*auth, fastapi_errors, _fault_middleware], client_max_size=64 * 1024**2
    )
    em = Emulator(config, engine, codec, tier)
    app[EMULATOR] = em
    app.on_response_prepare.append(_drop_content_type)

    async def lifecycle(_app: web.Application) -> AsyncIterator[None]:
        await em.start()
        yield
        await em.stop()

    app.cleanup_ctx.append(lifecycle)
    r = app.router
    for method in ("POST", "PUT"):
        r.add_route(method, "/generate", generate)
    r.add_post("/v1/chat/completions", chat_completions)
    r.add_post("/v1/completions", completions)
    messages.register(r)  # Anthropic Messages (emulator/messages.py)
    responses.register(r)  # OpenAI Responses (emulator/responses.py)
    for path in ("/health", "/health_generate"):
        r.add_get(path, health)
    r.add_get("/ready", ready)
    for path in ("/server_info", "/get_server_info"):
        r.add_get(path, server_info)
    for path in ("/model_info", "/get_model_info"):
        r.add_get(path, model_info)
    r.add_get("/v1/models", models)
    r.add_get("/v1/loads", loads)
    r.add_get("/metrics", metrics)
    r.add_get("/flush_cache", flush_cache)
    r.add_post("/flush_cache", flush_cache)
    r.add_post("/abort_request", abort_request)
    r.add_post("/hicache/storage-backend/clear", clear_storage_backend)
    r.add_post("/smetric/prefix_match", prefix_match)
    r.add_get("/emulator/faults", faults_handler)
    r.add_post("/emulator/faults", faults_handler)
    return app


async def start_server(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Serve app on host:port; a client that goes away cancels its handler (and so its request)."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
