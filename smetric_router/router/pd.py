"""Prefill-decode disaggregated dispatch, the way SGLang's router does it (mini_lb / the gateway).

Each request gets a (prefill, decode) pair: the prefill policy decides over prefill instances (load
= unprefilled tokens), the decode policy over decode instances (load = tokens in use). The JSON
body gains `bootstrap_host` (the prefill URL's host, IPv6 bracketed), `bootstrap_port` (the
prefill's bootstrap server) and `bootstrap_room` (random, < 2^63); a batched /generate gets one of
each per prompt. The same body goes to both at once and the client gets the decode's answer.

Prefill done = the earliest of: the prefill's reply ending (SGLang's prefill answers once the KV
is handed over) or the decode's first body byte (a decode cannot emit before it holds the KV).
That ends the prefill's unprefilled-token count, which so also covers the prefill's bootstrap
queue (waiting for the decode's handshake), left out of SGLang's num_waiting_uncached_tokens.
Until then the router bounds the wait by --pd-handover-timeout-secs, so a prefill that never hands
over its KV cannot hang a client.

Both requests go through the proxy's own client (upstream.py): the same keep-alive pools, bound on
connections and strict parsing as colocated routing.

Faults: a prefill or decode failing before the decode's first byte reached us (refused, 5xx, a
malformed head) ends the attempt on both sides and the pair is re-chosen without that instance;
one that dropped the connection after it was sent the request is not re-tried (unless
--retry-on-reset), as in colocated routing (proxy.py), nor is the router's own shortage of file
descriptors or connection slots (503). After that first byte, a lost or stalled decode stream
ends with an SSE error event and [DONE]. The decode's first byte (streams) and its silences
mid-stream are bounded as in colocated routing; a decode waiting for its KV cache is not silent
until its prefill has ended (the handover timeout bounds that wait).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any
from urllib.parse import urlsplit

import orjson
from aiohttp import web
from multidict import CIMultiDict

from smetric_router.breaker.state import Outcome, Pass
from smetric_router.core import tracing
from smetric_router.core.tracing import AttrValue
from smetric_router.core.types import RequestFeatures
from smetric_router.router.api_messages import stream_dialect
from smetric_router.router.auth import upstream_auth_line
from smetric_router.router.errors import RouterError, bad_request, worker_error_reply
from smetric_router.router.metrics import RouterMetrics
from smetric_router.router.proxy import (
    DROP_RESPONSE,
    REASON_HEADER,
    WORKER_HEADER,
    copy_stream,
    decision_attributes,
    forward_head,
    hit_headers,
    local_error,
    note_cut,
    reset_error,
    stalled_error,
)
from smetric_router.router.routing import Routed, Router
from smetric_router.router.upstream import (
    LocalError,
    Lost,
    Reset,
    Response,
    Stalled,
    Timeouts,
    Unreachable,
    Upstream,
    UpstreamError,
)
from smetric_router.router.workers import Worker, WorkerRegistry

log = logging.getLogger(__name__)

PREFILL_HEADER = "x-smetric-prefill-worker"
_ROOM_BITS = 63  # SGLang: random.randint(0, 2**63 - 1); the gateway masks a u64 with i64::MAX


class Side(str, Enum):
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True, slots=True)
class Pair:
    prefill: Routed
    decode: Routed

    def side(self, side: Side) -> Routed:
        return self.prefill if side is Side.PREFILL else self.decode

    def headers(self) -> dict[str, str]:
        return {
            PREFILL_HEADER: self.prefill.decision.worker,
            WORKER_HEADER: self.decode.decision.worker,
            REASON_HEADER: self.prefill.decision.reason,
            **hit_headers(self.prefill),
        }


@dataclass(frozen=True, slots=True)
class _Failed:
    """An attempt that failed before any byte reached the client: retry elsewhere if possible."""

    side: Side
    worker: str
    why: str
    status: int | None = None  # the worker's own 5xx, relayed as is on the last try
    body: bytes = b""
    content_type: str = "application/json"
    retry: bool = True  # False: dropped after it was sent (see --retry-on-reset)


# Set when the decode's stream was cut after its head: the attempt returned a 200 to the client,
# so only the request says that the decode failed it.
_DECODE_CUT: web.RequestKey[bool] = web.RequestKey("smetric_pd_decode_cut", bool)

# Failures that say nothing about the worker named: it was removed, or the router held it back.
_NOT_THE_WORKERS = ("removed", "circuit open")


def _verdicts(outcome: web.StreamResponse | _Failed, decode_cut: bool) -> dict[Side, Outcome]:
    """What one attempt's end says about each side. A failed side failed, the other said
    nothing; an answer is the decode's (a prefill's own 4xx is relayed as an answer too, and
    a 4xx is the client's doing). decode_cut: the decode's stream was lost or stalled after
    its head went out, which is the decode's failure though the client got a 200."""
    if decode_cut:
        return {Side.PREFILL: Outcome.SUCCESS, Side.DECODE: Outcome.FAILURE}
    if isinstance(outcome, _Failed):
        failed = Outcome.IGNORED if outcome.why in _NOT_THE_WORKERS else Outcome.FAILURE
        other = Side.DECODE if outcome.side is Side.PREFILL else Side.PREFILL
        return {outcome.side: failed, other: Outcome.IGNORED}
    if outcome.status >= 500:
        return {Side.PREFILL: Outcome.IGNORED, Side.DECODE: Outcome.FAILURE}
    if outcome.status >= 400:
        return {Side.PREFILL: Outcome.IGNORED, Side.DECODE: Outcome.IGNORED}
    return {Side.PREFILL: Outcome.SUCCESS, Side.DECODE: Outcome.SUCCESS}


def _error_verdicts(e: RouterError) -> dict[Side, Outcome]:
    """The router's own errors that name a side's fault: a prefill that never handed over, a
    decode that did not answer in time; a stalled worker is already marked unhealthy."""
    prefill = Outcome.FAILURE if e.code == "prefill_timeout" else Outcome.IGNORED
    decode = Outcome.FAILURE if e.code == "worker_timeout" else Outcome.IGNORED
    return {Side.PREFILL: prefill, Side.DECODE: decode}


def _worker_error(status: int, body: bytes, content_type: str, pair: Pair) -> web.Response:
    """A worker's own error reply, in OpenAI's shape."""
    body, content_type = worker_error_reply(status, body, content_type)
    headers = {**pair.headers(), "Content-Type": content_type}
    return web.Response(status=status, body=body, headers=headers)


def pd_decision_attributes(pair: Pair, pd: PdProxy) -> dict[str, AttrValue | None]:
    """A PD decision as span attributes (--enable-trace): the prefill side's as colocated
    routing's (smetric.*), the decode side's under smetric.decode.*."""
    return {
        **decision_attributes(pair.prefill, pd.prefill_router.policy.name),
        **decision_attributes(pair.decode, pd.decode_router.policy.name, "smetric.decode."),
    }


def _leg_attributes(worker: Worker, path: str, routed: Routed, tries: int) -> dict[str, Any]:
    return {
        "http.request.method": "POST",
        "url.full": worker.url + path,
        "smetric.worker": worker.url,
        "smetric.reason": routed.decision.reason,
        "smetric.retry": tries,  # 0: the first attempt
    }


def bootstrap_host(url: str) -> str:
    host = urlsplit(url).hostname or ""
    return f"[{host}]" if ":" in host else host


def batch_size(path: str, body: dict[str, Any]) -> int | None:
    """Prompts in a batched request (None: one prompt). Batched /v1/completions is refused."""
    if path == "/generate":
        text, ids = body.get("text"), body.get("input_ids")
        if isinstance(text, list):
            return len(text)
        if isinstance(ids, list) and ids and isinstance(ids[0], list):
            return len(ids)
        return None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        raise bad_request(
            "Batched prompts are not supported under PD disaggregation: send one prompt per "
            "request, or a batch to /generate.",
            param="prompt",
        )
    return None


def with_bootstrap(body: dict[str, Any], prefill: Worker, n: int | None) -> bytes:
    host, port = bootstrap_host(prefill.url), prefill.bootstrap_port
    fields: dict[str, Any]
    if n is None:
        fields = {"bootstrap_room": random.getrandbits(_ROOM_BITS)}
        fields.update(bootstrap_host=host, bootstrap_port=port)
    else:
        rooms = [random.getrandbits(_ROOM_BITS) for _ in range(n)]
        fields = {"bootstrap_host": [host] * n, "bootstrap_port": [port] * n}
        fields["bootstrap_room"] = rooms
    return orjson.dumps({**body, **fields})


class _Held:
    """What one attempt adds to its pair's counts, taken back exactly once."""

    def __init__(
        self,
        prefill: Worker,
        decode: Worker,
        unprefilled: int,
        tokens: int,
        counted: Callable[[], None] = lambda: None,
    ) -> None:
        self.prefill, self.decode = prefill, decode
        self.unprefilled, self.tokens = unprefilled, tokens
        self.prefilling = self.decoding = True
        self._counted = counted
        prefill.inflight += 1
        prefill.tokens += unprefilled
        prefill.routed(unprefilled)
        decode.inflight += 1
        decode.tokens += tokens
        counted()

    def prefill_done(self) -> None:
        if self.prefilling:
            self.prefilling = False
            self.prefill.inflight -= 1
            self.prefill.tokens -= self.unprefilled
            self._counted()

    def release(self) -> None:
        self.prefill_done()
        if self.decoding:
            self.decoding = False
            self.decode.inflight -= 1
            self.decode.tokens -= self.tokens
            self._counted()


@dataclass(slots=True)
class PdProxy:
    upstream: Upstream  # colocated routing's client: its pools and its bound on connections
    prefill_router: Router
    decode_router: Router
    registry: WorkerRegistry
    metrics: RouterMetrics
    max_retries: int
    timeout: float  # each side's whole exchange, body included
    handover_timeout: float
    first_byte_timeout: float | None = None  # streams: dispatch to the decode's first byte
    stream_idle_timeout: float | None = None
    retry_on_reset: bool = False

    def route(
        self,
        features: RequestFeatures,
        model: str | None,
        probed: Mapping[str, tuple[int, int]] | None = None,
        l3: int | None = 0,
    ) -> Pair:
        """probed: the prefill side's probe round (--cache-view probe), where KV reuse pays;
        l3: its global-tier hit, which only prefill instances load."""
        return Pair(
            self.prefill_router.route(features, model, probed, l3),
            self.decode_router.route(features, model),
        )

    async def dispatch(
        self,
        request: web.Request,
        path: str,
        body: dict[str, Any],
        pair: Pair,
        started: float,
        label: str,
    ) -> web.StreamResponse:
        n = batch_size(path, body)
        headers = forward_head(request.raw_headers, tracing.enabled) + upstream_auth_line(request)
        excluded: dict[Side, list[str]] = {Side.PREFILL: [], Side.DECODE: []}
        while True:
            prefill = self.registry.workers.get(pair.prefill.decision.worker)
            decode = self.registry.workers.get(pair.decode.decision.worker)
            if prefill is None or decode is None:  # removed while an earlier try was in flight
                side = Side.PREFILL if prefill is None else Side.DECODE
                outcome: web.StreamResponse | _Failed = _Failed(
                    side, pair.side(side).decision.worker, "removed"
                )
            else:
                payload = with_bootstrap(body, prefill, n)
                stream = body.get("stream") is True
                tries = len(excluded[Side.PREFILL]) + len(excluded[Side.DECODE])
                outcome = await self._through_circuits(
                    request, path, payload, headers, pair, prefill, decode, started, label, stream,
                    tries, excluded,
                )  # fmt: skip
            if isinstance(outcome, web.StreamResponse):
                return outcome
            side_routed = pair.side(outcome.side)
            tries = len(excluded[Side.PREFILL]) + len(excluded[Side.DECODE])
            if not outcome.retry or not self._can_retry(side_routed, excluded[outcome.side], tries):
                return self._give_up(outcome, pair, tries)
            self.metrics.retries.labels(outcome.worker).inc()
            log.warning("retrying away from %s: %s", outcome.worker, outcome.why)
            excluded[outcome.side].append(outcome.worker)
            router = self.prefill_router if outcome.side is Side.PREFILL else self.decode_router
            rerouted = router.reroute(side_routed, excluded[outcome.side])
            pair = replace(pair, **{outcome.side.value: rerouted})

    async def _through_circuits(
        self,
        request: web.Request,
        path: str,
        payload: bytes,
        headers: bytes,
        pair: Pair,
        prefill: Worker,
        decode: Worker,
        started: float,
        label: str,
        stream: bool,
        tries: int,
        excluded: dict[Side, list[str]],
    ) -> web.StreamResponse | _Failed:
        """One attempt, if both circuits let it through, and what it says about each side."""
        passes: dict[Side, Pass] = {}
        for side, w in ((Side.PREFILL, prefill), (Side.DECODE, decode)):
            last = not self._can_retry(pair.side(side), excluded[side], tries)
            passed = self.registry.begin(w.url, last)
            if passed is None:  # opened, or its probes filled, since the decision
                for s, p in passes.items():
                    self.registry.record(pair.side(s).decision.worker, p, Outcome.IGNORED)
                return _Failed(side, w.url, "circuit open")
            passes[side] = passed
        verdicts = {Side.PREFILL: Outcome.IGNORED, Side.DECODE: Outcome.IGNORED}
        try:
            outcome = await self._attempt(
                request, path, payload, headers, pair, prefill, decode, started, label, stream,
                tries,
            )  # fmt: skip
            verdicts = _verdicts(outcome, request.get(_DECODE_CUT, False))
            return outcome
        except RouterError as e:
            verdicts = _error_verdicts(e)
            raise
        finally:
            self.registry.record(prefill.url, passes[Side.PREFILL], verdicts[Side.PREFILL])
            self.registry.record(decode.url, passes[Side.DECODE], verdicts[Side.DECODE])

    def _can_retry(self, routed: Routed, excluded: list[str], tries: int) -> bool:
        if tries >= self.max_retries:
            return False
        current = routed.decision.worker
        return any(
            w.healthy and w.url != current and w.url not in excluded for w in routed.view.workers
        )

    def _give_up(self, failed: _Failed, pair: Pair, tries: int) -> web.Response:
        if failed.status is not None:  # the worker's own answer, as colocated routing does
            return _worker_error(failed.status, failed.body, failed.content_type, pair)
        if not failed.retry:
            who = f"{failed.side.value} worker {failed.worker}"
            raise reset_error(who, failed.why, pair.headers())
        raise RouterError(
            502,
            f"{failed.side.value} worker {failed.worker} failed ({failed.why}) "
            f"after {tries} retries",
            type_="server_error",
            code="worker_unavailable",
            headers=pair.headers(),
        )

    async def _attempt(
        self,
        request: web.Request,
        path: str,
        payload: bytes,
        headers: bytes,
        pair: Pair,
        prefill: Worker,
        decode: Worker,
        started: float,
        label: str,
        stream: bool = False,
        tries: int = 0,
    ) -> web.StreamResponse | _Failed:
        # Each leg's span: siblings under the request's span, a pair of them per attempt.
        p_span = tracing.client_span(
            "prefill",
            _leg_attributes(prefill, path, pair.prefill, tries) if tracing.enabled else None,
        )
        d_span = tracing.client_span(
            "decode", _leg_attributes(decode, path, pair.decode, tries) if tracing.enabled else None
        )
        try:
            outcome = await self._attempt_legs(
                request, path, payload, headers, pair, prefill, decode, started, label, stream,
                p_span, d_span,
            )  # fmt: skip
            if isinstance(outcome, _Failed):  # (the prefill's span ended with its reply)
                (p_span if outcome.side is Side.PREFILL else d_span).fail(outcome.why)
            else:
                d_span.set("http.response.status_code", outcome.status)
            return outcome
        except asyncio.CancelledError:
            d_span.set("smetric.cancelled", True)
            raise
        except BaseException as e:
            d_span.fail(str(e) or type(e).__name__)
            raise
        finally:
            p_span.end()
            d_span.end()

    async def _attempt_legs(
        self,
        request: web.Request,
        path: str,
        payload: bytes,
        headers: bytes,
        pair: Pair,
        prefill: Worker,
        decode: Worker,
        started: float,
        label: str,
        stream: bool,
        p_span: tracing.Span,
        d_span: tracing.Span,
    ) -> web.StreamResponse | _Failed:
        features = pair.prefill.features
        # What the prefill will not compute: its local hit, or what it loads from L3.
        w = pair.prefill.view.worker(prefill.url)
        hit = max(w.hit, w.l3_hit or 0) if w is not None else 0
        held = _Held(
            prefill,
            decode,
            max(0, features.prompt_len - hit),
            features.prompt_len,
            self.registry.counted,
        )
        # The prompt's pages count as held by the prefill until it is done (cluster/inflight.py).
        pending = self.prefill_router.hold(prefill.url, features)
        p_task = asyncio.create_task(self._prefill(prefill, path, payload, headers, pair, p_span))
        bounds = Timeouts(self.timeout)
        if stream:
            # Past its first-byte bound, a decode is not silent while its prefill runs: the KV
            # it waits for is not there yet (the handover timeout bounds that).
            bounds = Timeouts(
                self.timeout,
                self.first_byte_timeout,
                self.stream_idle_timeout,
                alive=lambda: not p_task.done(),
                not_alive="its prefill has ended",
            )
        d_task = asyncio.create_task(
            self._decode_head(decode, path, payload, headers, pair, bounds, d_span)
        )
        try:
            done, _ = await asyncio.wait(
                (p_task, d_task), timeout=self.handover_timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                raise RouterError(
                    504,
                    f"prefill {prefill.url} did not hand over the KV cache within "
                    f"{self.handover_timeout:g} s",
                    type_="server_error",
                    code="prefill_timeout",
                    headers=pair.headers(),
                )
            if p_task.done() and not d_task.done():
                problem = self._prefill_outcome(p_task, prefill, pair)
                if problem is not None:
                    return problem
                held.prefill_done()
                self.prefill_router.release(pending, ran=True)
            head = await d_task
            held.prefill_done()  # the decode's first byte: the KV has arrived
            if isinstance(head, _Failed):
                return head
            self.prefill_router.release(pending, ran=True)
            resp, first = head
            try:
                return await self._relay(request, resp, first, pair, decode, started, label)
            finally:
                resp.close()
        except asyncio.TimeoutError:
            raise RouterError(
                504,
                f"decode {decode.url} did not answer within the request timeout",
                type_="server_error",
                code="worker_timeout",
                headers=pair.headers(),
            ) from None
        finally:
            held.release()
            self.prefill_router.release(pending, ran=False)  # unless released above
            for t in (p_task, d_task):
                t.cancel()
            for result in await asyncio.gather(p_task, d_task, return_exceptions=True):
                if isinstance(result, tuple) and isinstance(result[0], Response):
                    result[0].close()  # a decode head nobody relayed

    def _prefill_outcome(
        self, task: asyncio.Task[tuple[int, bytes, str] | _Failed], prefill: Worker, pair: Pair
    ) -> web.Response | _Failed | None:
        """None when the prefill finished well; otherwise what ends this attempt."""
        try:
            outcome = task.result()
        except asyncio.TimeoutError as e:
            return _Failed(Side.PREFILL, prefill.url, str(e) or type(e).__name__)
        if isinstance(outcome, _Failed):
            return outcome
        status, body, content_type = outcome
        if status >= 500:
            return _Failed(Side.PREFILL, prefill.url, f"HTTP {status}", status, body, content_type)
        if status >= 400:  # the request itself was refused: the decode would never get its KV
            return _worker_error(status, body, content_type, pair)
        return None

    def _failed(
        self, side: Side, worker: Worker, e: UpstreamError, pair: Pair, sent: bool
    ) -> _Failed:
        """What a failed request to one side means for the attempt (may raise the 503 of the
        router's own shortage, or the 504 of a stalled worker). sent: it failed after its head."""
        why_ = str(e) or type(e).__name__
        if isinstance(e, LocalError):
            raise local_error(why_, pair.headers())
        if isinstance(e, Stalled):
            self.registry.mark_failed(worker, why_)
            raise stalled_error(worker.url, why_, pair.headers())
        if isinstance(e, Unreachable):  # never sent
            if e.refused:  # a dropped keep-alive connection can be a benign race
                self.registry.mark_failed(worker, why_)
            return _Failed(side, worker.url, why_)
        if isinstance(e, Reset) or (isinstance(e, Lost) and sent):
            # Sent, then dropped: the worker may have run it, and died of it.
            self.registry.mark_failed(worker, why_)
            return _Failed(side, worker.url, why_, retry=self.retry_on_reset)
        return _Failed(side, worker.url, why_)  # a malformed head: another may do better

    async def _prefill(
        self,
        worker: Worker,
        path: str,
        payload: bytes,
        headers: bytes,
        pair: Pair,
        span: tracing.Span = tracing.NO_SPAN,
    ) -> tuple[int, bytes, str] | _Failed:
        """The prefill's whole reply; its span ends with it (the KV is handed over by then)."""
        try:
            trace = span.trace_lines()
            try:
                resp = await self.upstream.post(
                    worker.url, path, headers, payload, self.timeout, trace
                )
            except UpstreamError as e:
                span.fail(str(e) or type(e).__name__)
                return self._failed(Side.PREFILL, worker, e, pair, sent=False)
            span.set("http.response.status_code", resp.status)
            if resp.status >= 500:
                span.fail(f"HTTP {resp.status}")
            try:
                return resp.status, await resp.read(), resp.content_type
            except UpstreamError as e:
                span.fail(str(e) or type(e).__name__)
                return self._failed(Side.PREFILL, worker, e, pair, sent=True)
            finally:
                resp.close()
        finally:
            span.end()

    async def _decode_head(
        self,
        worker: Worker,
        path: str,
        payload: bytes,
        headers: bytes,
        pair: Pair,
        bounds: Timeouts,
        span: tracing.Span = tracing.NO_SPAN,
    ) -> tuple[Response, bytes] | _Failed:
        """The decode's response with its first chunk (a stream) or whole body (otherwise)."""
        try:
            trace = span.trace_lines()
            resp = await self.upstream.post(worker.url, path, headers, payload, bounds, trace)
        except UpstreamError as e:
            return self._failed(Side.DECODE, worker, e, pair, sent=False)
        try:
            if resp.status >= 500:
                why_ = f"HTTP {resp.status}"
                body, ctype = await resp.read(), resp.content_type
                resp.close()
                return _Failed(Side.DECODE, worker.url, why_, resp.status, body, ctype)
            if resp.content_type == "text/event-stream":
                first = await resp.readany()
            else:
                first = await resp.read()
            span.event("first_byte")
        except UpstreamError as e:
            resp.close()
            return self._failed(Side.DECODE, worker, e, pair, sent=True)
        except BaseException:
            resp.close()
            raise
        return resp, first

    async def _relay(
        self,
        request: web.Request,
        resp: Response,
        first: bytes,
        pair: Pair,
        decode: Worker,
        started: float,
        label: str,
    ) -> web.StreamResponse:
        self.metrics.first_byte(label, time.perf_counter() - started)
        headers = CIMultiDict((k, v) for k, v in resp.headers if k.lower() not in DROP_RESPONSE)
        headers.update(pair.headers())
        if resp.content_type != "text/event-stream" or resp.status >= 400:
            if resp.status >= 400:
                first, headers["Content-Type"] = worker_error_reply(
                    resp.status, first, headers.get("Content-Type", "application/octet-stream")
                )
            return web.Response(status=resp.status, body=first, headers=headers)
        out = web.StreamResponse(status=resp.status, headers=headers)
        await out.prepare(request)
        await out.write(first)
        tail = first[-64:] if first else b"\n\n"  # enough for any API's end marker
        dialect = stream_dialect(request.path)  # Anthropic's error event on /v1/messages
        cut = await copy_stream(out, resp, decode.url, self.metrics, tail, **dialect)
        note_cut(request, self.registry, decode, cut)
        if cut is not None and not isinstance(cut, asyncio.CancelledError):
            request[_DECODE_CUT] = True  # the router's shutdown is no failure
        return out
