"""Forwarding to the chosen worker: retries before the first byte, byte-exact pass-through after.

A worker that refuses the connection or answers 5xx before sending its body is retried on another
worker (re-decided without it). A worker whose connection ends after it was sent the request is
not (unless --retry-on-reset): a generation is not idempotent, and a request that killed one worker
would kill the next. The router's own shortage (file descriptors, connection slots) is answered
503 and says nothing about the worker. A worker silent past --first-byte-timeout-secs (for a
non-streamed request, whose first byte is its whole answer, only once the worker also fails its
health checks) or --stream-idle-timeout-secs is marked failed and the request answered 504. Once
response bytes flow to the client there is no retry: a stream whose worker disappears or stalls is
closed with an SSE error event and `data: [DONE]`, so clients never hang, and counted as a
stream_error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web
from multidict import CIMultiDict

from smetric_router.breaker.state import Verdict
from smetric_router.core import tracing
from smetric_router.core.tracing import AttrValue
from smetric_router.core.types import RequestFeatures
from smetric_router.router import api_responses
from smetric_router.router.api_messages import API_KEY_HEADER, stream_dialect
from smetric_router.router.auth import upstream_auth_line
from smetric_router.router.drain import SHUTDOWN_CODE, take_ended
from smetric_router.router.errors import RouterError, sse_error_event, worker_error_reply
from smetric_router.router.metrics import RouterMetrics
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
from smetric_router.router.workers import PrefillShare, Worker, WorkerRegistry

log = logging.getLogger(__name__)

WORKER_HEADER = "x-smetric-worker"
REASON_HEADER = "x-smetric-reason"
HIT_HEADER = "x-smetric-hit"
TIER_HEADER = "x-smetric-tier"

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
DROP_RESPONSE = _HOP_BY_HOP | {"date", "server"}
# Set on a request whose stream was cut after its head went out (the generation handler counts
# it as a stream_error, not as the 200 the client saw first).
STREAM_CUT: web.RequestKey[bool] = web.RequestKey("smetric_stream_cut", bool)


# aiohttp has already decoded the body the router forwards; router/auth.py decides what the
# worker gets for Authorization (upstream_auth_line); an Anthropic client's x-api-key is the
# router's key, never the workers'.
_NOT_FORWARDED = _HOP_BY_HOP | {"content-encoding", "authorization", API_KEY_HEADER}
# With --enable-trace the worker gets the router's own trace context (its attempt span), not the
# client's: the client's is the parent of the router's server span.
_NOT_FORWARDED_TRACED = _NOT_FORWARDED | {"traceparent", "tracestate"}


def _forwarded(name: str, dropped: frozenset[str] = _NOT_FORWARDED) -> bool:
    """Whether a client's request header (lower-case name) goes on to the worker."""
    return name not in dropped and not name.startswith("x-smetric-")


def forward_head(raw: Iterable[tuple[bytes, bytes]], traced: bool = False) -> bytes:
    """The client's request headers that go on to the worker, as HTTP/1.1 header lines.
    traced: the router sends its own trace context (upstream.post's `trace`)."""
    dropped = _NOT_FORWARDED_TRACED if traced else _NOT_FORWARDED
    return b"".join(
        b"%s: %s\r\n" % (k, v) for k, v in raw if _forwarded(k.lower().decode("latin-1"), dropped)
    )


class Body(Protocol):
    """What copy_stream reads: an upstream Response (or one whose ids are rewritten)."""

    async def readany(self) -> bytes: ...

    def is_eof(self) -> bool: ...


def decision_headers(routed: Routed) -> dict[str, str]:
    return {
        WORKER_HEADER: routed.decision.worker,
        REASON_HEADER: routed.decision.reason,
        **hit_headers(routed),
    }


def hit_headers(routed: Routed) -> dict[str, str]:
    """The chosen worker's cached prefix by tier, as the router saw it when deciding (the
    global tier's part once its lookup answered: Router.settle):
    x-smetric-hit `gpu=N; host=N; l3=N|unknown` in leading prompt tokens (gpu: on its GPU; host:
    on its GPU or host, HiCache's L1+L2; l3: in the global tier, 0 without an L3 view) and
    x-smetric-tier: where the deepest part of it comes from (gpu, host, l3 or none)."""
    w = routed.view.worker(routed.decision.worker)
    if w is None:
        return {}
    l3 = "unknown" if w.l3_hit is None else str(w.l3_hit)
    if w.l3_hit is not None and w.l3_hit > w.hit:
        tier = "l3"
    elif w.hit > w.gpu_hit:
        tier = "host"
    else:
        tier = "gpu" if w.gpu_hit else "none"
    return {HIT_HEADER: f"gpu={w.gpu_hit}; host={w.hit}; l3={l3}", TIER_HEADER: tier}


def feature_attributes(features: RequestFeatures) -> dict[str, AttrValue | None]:
    """The features span's attributes (--enable-trace)."""
    return {
        "smetric.prompt_tokens": features.prompt_len,
        "smetric.pages": len(features.page_hashes),
        "smetric.turn": features.turn,
        "smetric.est_hit": features.est_hit,
        "smetric.session_hint": features.session_hint,
    }


def decision_attributes(
    routed: Routed, policy: str, prefix: str = "smetric."
) -> dict[str, AttrValue | None]:
    """A decision as span attributes (--enable-trace): what the x-smetric-* headers say, and what
    the policy saw: the request's turn, est_hit and session hint, the chosen worker's load and
    the mean load of the healthy candidates. prefix: "smetric.decode." for PD's decode side."""
    d, f, view = routed.decision, routed.features, routed.view
    chosen = view.worker(d.worker)
    loads = [w.load for w in view.workers if w.healthy]
    attrs: dict[str, AttrValue | None] = {
        prefix + "policy": policy,
        prefix + "reason": d.reason,
        prefix + "worker": d.worker,
        prefix + "candidates": len(loads),
        prefix + "worker_load": chosen.load if chosen is not None else None,
        prefix + "mean_load": sum(loads) / len(loads) if loads else None,
    }
    if prefix == "smetric.":  # the request's own, once
        attrs.update(
            {
                "smetric.turn": f.turn,
                "smetric.est_hit": f.est_hit,
                "smetric.session_hint": f.session_hint,
            }
        )
    if chosen is not None:
        attrs.update(
            {
                prefix + "hit.gpu": chosen.gpu_hit,
                prefix + "hit.host": chosen.hit,
                prefix + "hit.l3": "unknown" if chosen.l3_hit is None else chosen.l3_hit,
                prefix + "tier": hit_headers(routed).get(TIER_HEADER),
            }
        )
    return attrs


def local_error(why: str, headers: Mapping[str, str]) -> RouterError:
    """The router's own shortage: 503 for this request, nothing against the worker."""
    log.warning("request refused for lack of local resources: %s", why)
    return RouterError(
        503,
        f"the router is out of connection resources ({why}); retry shortly",
        type_="server_error",
        code="router_overloaded",
        headers={**headers, "Retry-After": "1"},
        close=True,
    )


def stalled_error(worker: str, why: str, headers: Mapping[str, str]) -> RouterError:
    return RouterError(
        504,
        f"worker {worker} stalled: {why}",
        type_="server_error",
        code="worker_timeout",
        headers=headers,
    )


def reset_error(who: str, why: str, headers: Mapping[str, str]) -> RouterError:
    """`who`: "worker URL" (or "prefill worker URL" under PD)."""
    return RouterError(
        502,
        f"{who} dropped the request after accepting it ({why}); not retried on another "
        "worker, as the request may be what brought it down (--retry-on-reset retries)",
        type_="server_error",
        code="worker_reset",
        headers=headers,
    )


@dataclass(slots=True)
class Proxy:
    upstream: Upstream
    router: Router
    registry: WorkerRegistry
    metrics: RouterMetrics
    max_retries: int
    timeout: float  # a request's whole exchange with its worker, body included
    first_byte_timeout: float | None = None  # streams: dispatch to the first body byte
    stream_idle_timeout: float | None = None  # silence between body bytes once they flow
    retry_on_reset: bool = False

    def timeouts(self, stream: bool, worker: Worker) -> Timeouts:
        if stream:
            return Timeouts(self.timeout, self.first_byte_timeout, self.stream_idle_timeout)
        # A non-streamed reply's first byte is its whole answer: past the first-byte bound it is
        # still awaited while its worker passes its health checks (a hung SGLang fails them).
        return Timeouts(self.timeout, self.first_byte_timeout, alive=lambda: worker.healthy)

    async def dispatch(
        self,
        request: web.Request,
        path: str,
        body: bytes,
        routed: Routed,
        started: float,
        label: str,
        stream: bool = False,
    ) -> web.StreamResponse:
        headers = forward_head(request.raw_headers, tracing.enabled) + upstream_auth_line(request)
        excluded: list[str] = []
        while True:
            worker = self.registry.workers.get(routed.decision.worker)
            # On the last try a worker's own 5xx goes back to the client as it is.
            last = not self._can_retry(routed, excluded)
            passed = None if worker is None else self.registry.begin(worker.url, last)
            if worker is None:  # removed while an earlier try was in flight
                why = "removed"
            elif passed is None:  # its circuit opened, or its probes filled, since the decision
                why = "circuit open"
            else:
                verdict = Verdict()
                # Its pages count as held there from now (no await since the decision) until it
                # ends: a request routed meanwhile sees them (cluster/inflight.py).
                hold = self.router.hold(worker.url, routed.features)
                share = PrefillShare(worker, new_tokens(routed, worker.url), self.registry.counted)
                ran = False  # whether the worker took it (then its KV events are on the way)
                # one span per attempt, siblings under the request's span
                attempt = tracing.client_span("upstream", self._attempt_attributes(
                    worker, path, routed, len(excluded)) if tracing.enabled else None)  # fmt: skip
                try:
                    bounds = self.timeouts(stream, worker)
                    sent = await self._send(
                        worker, path, body, headers, last, bounds, routed, verdict,
                        attempt.trace_lines(),
                    )  # fmt: skip
                    why, resp = sent
                    if resp is not None:
                        ran = resp.status < 400
                        attempt.set("http.response.status_code", resp.status)
                        if resp.status >= 500:
                            attempt.fail(f"HTTP {resp.status}")
                        return await self._relay(
                            request, worker, resp, routed, started, label, verdict, attempt,
                            share.done,
                        )  # fmt: skip
                    attempt.fail(why)
                except asyncio.TimeoutError:
                    verdict.failed()
                    attempt.fail("request timeout")
                    raise RouterError(
                        504,
                        f"worker {worker.url} did not answer within the request timeout",
                        type_="server_error",
                        code="worker_timeout",
                        headers=decision_headers(routed),
                    ) from None
                except asyncio.CancelledError:
                    attempt.set("smetric.cancelled", True)
                    raise
                except BaseException as e:
                    attempt.fail(str(e) or type(e).__name__)
                    raise
                finally:
                    attempt.end()
                    share.done()
                    self.router.release(hold, ran=ran)
                    self.registry.record(worker.url, passed, verdict.outcome)
            if last:
                raise RouterError(
                    502,
                    f"worker {routed.decision.worker} failed ({why}) after {len(excluded)} retries",
                    type_="server_error",
                    code="worker_unavailable",
                    headers=decision_headers(routed),
                )
            self.metrics.retries.labels(routed.decision.worker).inc()
            log.warning("retrying away from %s: %s", routed.decision.worker, why)
            excluded.append(routed.decision.worker)
            routed = self.router.reroute(routed, excluded)

    def _attempt_attributes(
        self, worker: Worker, path: str, routed: Routed, retries: int
    ) -> dict[str, AttrValue | None]:
        return {
            "http.request.method": "POST",
            "url.full": worker.url + path,
            "smetric.worker": worker.url,
            "smetric.reason": routed.decision.reason,
            "smetric.retry": retries,  # 0: the first attempt
        }

    def _can_retry(self, routed: Routed, excluded: list[str]) -> bool:
        if len(excluded) >= self.max_retries:
            return False
        current = routed.decision.worker
        return any(
            w.usable and w.url != current and w.url not in excluded for w in routed.view.workers
        )

    async def _send(
        self,
        worker: Worker,
        path: str,
        body: bytes,
        headers: bytes,
        last: bool,
        timeouts: Timeouts,
        routed: Routed,
        verdict: Verdict,
        trace: bytes = b"",
    ) -> tuple[str, Response | None]:
        """Open the request; a retryable failure comes back as (why, None)."""
        worker.inflight += 1
        self.registry.counted()
        try:
            resp = await self.upstream.post(worker.url, path, headers, body, timeouts, trace)
        except Unreachable as e:
            worker.inflight -= 1
            why = str(e) or type(e).__name__
            # Only a refused or unroutable connection says the worker is down; a dropped
            # keep-alive connection can be a benign race.
            if e.refused:
                verdict.failed()
                self.registry.mark_failed(worker, why)
            return why, None
        except Reset as e:
            worker.inflight -= 1
            verdict.failed()
            self.registry.mark_failed(worker, str(e))
            if self.retry_on_reset and not last:
                return str(e), None
            raise reset_error(f"worker {worker.url}", str(e), decision_headers(routed)) from None
        except LocalError as e:
            worker.inflight -= 1
            raise local_error(str(e), decision_headers(routed)) from None
        except Stalled as e:
            worker.inflight -= 1
            verdict.failed()
            self.registry.mark_failed(worker, str(e))
            raise stalled_error(worker.url, str(e), decision_headers(routed)) from None
        except Lost as e:  # garbage for a head (Malformed): another worker may do better
            worker.inflight -= 1
            verdict.failed()
            return str(e), None
        except BaseException:
            worker.inflight -= 1
            raise
        if resp.status >= 500 and not last:
            worker.inflight -= 1
            verdict.failed()
            resp.close()
            return f"HTTP {resp.status}", None
        return "", resp

    async def _relay(
        self,
        request: web.Request,
        worker: Worker,
        resp: Response,
        routed: Routed,
        started: float,
        label: str,
        verdict: Verdict,
        span: tracing.Span = tracing.NO_SPAN,
        prefilled: Callable[[], None] = lambda: None,
    ) -> web.StreamResponse:
        try:
            routed = await self.router.settle(routed)
            headers = CIMultiDict((k, v) for k, v in resp.headers if k.lower() not in DROP_RESPONSE)
            headers.update(decision_headers(routed))
            if resp.content_type == "text/event-stream" and resp.status < 400:
                return await self._stream(
                    request, worker, resp, headers, started, label, verdict, span, prefilled
                )
            whole = await self._whole(worker, resp, headers, routed, started, label, verdict, span)
            ids = api_responses.rewriter(request, worker.url)  # Responses: ids carry the worker
            if ids is not None and isinstance(whole.body, bytes):
                whole.body = ids.whole(whole.body)
            return whole
        finally:
            worker.inflight -= 1
            self.registry.counted()
            resp.close()

    async def _whole(
        self,
        worker: Worker,
        resp: Response,
        headers: CIMultiDict[str],
        routed: Routed,
        started: float,
        label: str,
        verdict: Verdict,
        span: tracing.Span = tracing.NO_SPAN,
    ) -> web.Response:
        try:
            first = await resp.readany()
            self.metrics.first_byte(label, time.perf_counter() - started)
            span.event("first_byte")
            body = first + await resp.read() if first else first
        except Stalled as e:
            verdict.failed()
            self.registry.mark_failed(worker, str(e))
            raise stalled_error(worker.url, str(e), decision_headers(routed)) from None
        except (UpstreamError, asyncio.TimeoutError) as e:
            verdict.failed()
            # Cut short or malformed: none of it goes to the client.
            why = str(e) or type(e).__name__
            raise RouterError(
                502,
                f"worker {worker.url} was lost while sending its response ({why})",
                type_="server_error",
                code="worker_lost",
                headers=decision_headers(routed),
            ) from None
        verdict.answered(resp.status)
        if resp.status >= 400:
            body, headers["Content-Type"] = worker_error_reply(
                resp.status, body, headers.get("Content-Type", "application/octet-stream")
            )
        return web.Response(status=resp.status, body=body, headers=headers)

    async def _stream(
        self,
        request: web.Request,
        worker: Worker,
        resp: Response,
        headers: CIMultiDict[str],
        started: float,
        label: str,
        verdict: Verdict,
        span: tracing.Span = tracing.NO_SPAN,
        prefilled: Callable[[], None] = lambda: None,
    ) -> web.StreamResponse:
        # Headers go out at once, so a client sees the stream start before the first token;
        # when that token is already here, they go out with it, in one write.
        kind = _HeldHeaders if resp.has_body() else web.StreamResponse
        out = kind(status=resp.status, headers=headers)
        await out.prepare(request)

        def first() -> None:
            prefilled()  # the worker emits the first token once the prompt is prefilled
            self.metrics.first_byte(label, time.perf_counter() - started)
            span.event("first_byte")

        dialect = stream_dialect(request.path)  # Anthropic's error event on /v1/messages
        ids = api_responses.rewriter(request, worker.url)  # Responses: ids carry the worker
        body: Body = resp if ids is None else api_responses.RewrittenStream(resp, ids)
        cut = await copy_stream(out, body, worker.url, self.metrics, on_first=first, **dialect)
        note_cut(request, self.registry, worker, cut)
        if cut is None:
            verdict.answered(resp.status)
        elif not isinstance(cut, asyncio.CancelledError):  # the router's shutdown is no failure
            verdict.failed()
        if cut is not None:
            span.fail(f"stream cut: {cut or type(cut).__name__}")
        return out


class _HeldHeaders(web.StreamResponse):
    # aiohttp's switch (web.Response's default) to hold the headers until the first body write;
    # an aiohttp without it sends them at once, as StreamResponse does.
    _send_headers_immediately = False


def new_tokens(routed: Routed, url: str) -> int:
    """The prompt tokens the worker has to prefill for this request, as its decision saw them."""
    seen = routed.view.worker(url)
    return max(routed.features.prompt_len - (seen.hit if seen is not None else 0), 0)


def note_cut(
    request: web.Request, registry: WorkerRegistry, worker: Worker, cut: BaseException | None
) -> None:
    """After copy_stream: a cut stream counts as a stream_error; a stalled worker is failed."""
    if cut is not None:
        request[STREAM_CUT] = True
        if isinstance(cut, Stalled):
            registry.mark_failed(worker, str(cut))


_DONE = b"data: [DONE]\n\n"  # OpenAI's end of stream (SGLang's too)


async def copy_stream(
    out: web.StreamResponse,
    content: Body,
    upstream: str,
    metrics: RouterMetrics,
    tail: bytes = b"\n\n",
    on_first: Callable[[], None] | None = None,
    error_event: Callable[[str, str], bytes] = sse_error_event,
    done: bytes = _DONE,
) -> BaseException | None:
    """Pass chunks through as they come; a lost or stalled upstream ends the stream with an SSE
    error event and [DONE], and comes back as what ended it (None: the stream ended well).
    `tail`: the last bytes already written (to close a half-written event). `error_event` and
    `done`: the API's closing error event and its last event (OpenAI's by default). The reader
    bounds its own silences (upstream.Timeouts)."""
    while True:
        # Only upstream reads are guarded: a client that went away ends the handler.
        try:
            chunk = await content.readany()
        except (UpstreamError, asyncio.TimeoutError) as e:
            if tail.endswith(done):
                # The worker finished the stream and went away before closing it (killed after
                # its last event): the client has the whole answer, so no error event after it.
                await out.write_eof()
                return None
            why = str(e) or type(e).__name__
            stalled = isinstance(e, (Stalled, asyncio.TimeoutError))
            log.warning("stream from %s %s: %s", upstream, "stalled" if stalled else "lost", why)
            metrics.stream_errors.labels(upstream).inc()
            # Close a half-written event first so the error event parses on its own.
            sep = b"" if tail.endswith(b"\n\n") else b"\n\n"
            if stalled:
                event = error_event(f"worker {upstream} stalled: {why}", "worker_timeout")
            else:
                event = error_event(f"worker {upstream} lost mid-stream: {why}", "worker_lost")
            await out.write(sep + event)
            await out.write_eof()
            return e
        except asyncio.CancelledError as e:
            # The router's shutdown grace ran out (router/drain.py), or the client went away.
            if not take_ended():
                raise
            sep = b"" if tail.endswith(b"\n\n") else b"\n\n"
            msg = "the router shut down before the stream ended"
            await out.write(sep + error_event(msg, SHUTDOWN_CODE))
            await out.write_eof()
            return e
        if not chunk:
            break
        if on_first is not None:
            on_first()
            on_first = None
        if content.is_eof():
            # The last chunk and the stream's end (and the headers, if still held) in one write.
            await out.write_eof(chunk)
            return None
        await out.write(chunk)
        tail = (tail + chunk)[-len(done) :]
    await out.write_eof()
    return None
