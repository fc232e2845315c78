"""Forwarding to the chosen worker: retries before the first byte, byte-exact pass-through after.

A worker that refuses the connection or answers 5xx before sending its body is retried on another
worker (re-decided without it). Once response bytes flow to the client there is no retry: a stream
whose worker disappears is closed with an SSE error event and `data: [DONE]`, so clients never hang.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from smetric_router.router.errors import RouterError, sse_error_event
from smetric_router.router.metrics import RouterMetrics
from smetric_router.router.routing import Routed, Router
from smetric_router.router.upstream import Lost, Response, Unreachable, Upstream, UpstreamError
from smetric_router.router.workers import Worker, WorkerRegistry

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
# Failures that happen before the worker sent anything: safe to send the request elsewhere.
UNREACHABLE = (
    aiohttp.ClientConnectorError,
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientOSError,
)


# aiohttp has already decoded the body the router forwards.
_DECODED = frozenset({"content-encoding"})


def _forwarded(name: str) -> bool:
    """Whether a client's request header (lower-case name) goes on to the worker."""
    return name not in _HOP_BY_HOP and name not in _DECODED and not name.startswith("x-smetric-")


def forward_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    return CIMultiDict((k, v) for k, v in headers.items() if _forwarded(k.lower()))


def forward_head(raw: Iterable[tuple[bytes, bytes]]) -> bytes:
    """forward_headers as the header lines of an HTTP/1.1 request."""
    return b"".join(
        b"%s: %s\r\n" % (k, v) for k, v in raw if _forwarded(k.lower().decode("latin-1"))
    )


class Body(Protocol):
    """What copy_stream reads: an upstream Response, or an aiohttp StreamReader (PD)."""

    async def readany(self) -> bytes: ...

    def is_eof(self) -> bool: ...


def decision_headers(routed: Routed) -> dict[str, str]:
    return {
        WORKER_HEADER: routed.decision.worker,
        REASON_HEADER: routed.decision.reason,
        **hit_headers(routed),
    }


def hit_headers(routed: Routed) -> dict[str, str]:
    """The chosen worker's cached prefix by tier, as the router saw it when deciding:
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


@dataclass(slots=True)
class Proxy:
    upstream: Upstream
    router: Router
    registry: WorkerRegistry
    metrics: RouterMetrics
    max_retries: int
    timeout: float  # a request's whole exchange with its worker, body included

    async def dispatch(
        self,
        request: web.Request,
        path: str,
        body: bytes,
        routed: Routed,
        started: float,
        label: str,
    ) -> web.StreamResponse:
        headers = forward_head(request.raw_headers)
        excluded: list[str] = []
        while True:
            worker = self.registry.workers.get(routed.decision.worker)
            # On the last try a worker's own 5xx goes back to the client as it is.
            last = not self._can_retry(routed, excluded)
            if worker is None:  # removed while an earlier try was in flight
                why = "removed"
            else:
                # Its pages count as held there from now (no await since the decision) until it
                # ends: a request routed meanwhile sees them (cluster/inflight.py).
                hold = self.router.hold(worker.url, routed.features)
                ran = False  # whether the worker took it (then its KV events are on the way)
                try:
                    why, resp = await self._send(worker, path, body, headers, last)
                    if resp is not None:
                        ran = resp.status < 400
                        return await self._relay(request, worker, resp, routed, started, label)
                except asyncio.TimeoutError:
                    raise RouterError(
                        504,
                        f"worker {worker.url} did not answer within the request timeout",
                        type_="server_error",
                        code="worker_timeout",
                        headers=decision_headers(routed),
                    ) from None
                finally:
                    self.router.release(hold, ran=ran)
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

    def _can_retry(self, routed: Routed, excluded: list[str]) -> bool:
        if len(excluded) >= self.max_retries:
            return False
        current = routed.decision.worker
        return any(
            w.healthy and w.url != current and w.url not in excluded for w in routed.view.workers
        )

    async def _send(
        self, worker: Worker, path: str, body: bytes, headers: bytes, last: bool
    ) -> tuple[str, Response | None]:
        """Open the request; a retryable failure comes back as (why, None)."""
        worker.inflight += 1
        try:
            resp = await self.upstream.post(worker.url, path, headers, body, self.timeout)
        except Unreachable as e:
            worker.inflight -= 1
            why = str(e) or type(e).__name__
            # Only a refused or unroutable connection says the worker is down; a dropped
            # keep-alive connection can be a benign race.
            if e.refused:
                self.registry.mark_failed(worker, why)
            return why, None
        except Lost as e:  # garbage for a head: another worker may do better
            worker.inflight -= 1
            return str(e), None
        except BaseException:
            worker.inflight -= 1
            raise
        if resp.status >= 500 and not last:
            worker.inflight -= 1
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
    ) -> web.StreamResponse:
        try:
            headers = CIMultiDict((k, v) for k, v in resp.headers if k.lower() not in DROP_RESPONSE)
            headers.update(decision_headers(routed))
            if resp.content_type == "text/event-stream":
                return await self._stream(request, worker, resp, headers, started, label)
            return await self._whole(worker, resp, headers, routed, started, label)
        finally:
            worker.inflight -= 1
            resp.close()

    async def _whole(
        self,
        worker: Worker,
        resp: Response,
        headers: CIMultiDict[str],
        routed: Routed,
        started: float,
        label: str,
    ) -> web.Response:
        try:
            first = await resp.readany()
            self.metrics.first_byte(label, time.perf_counter() - started)
            body = first + await resp.read() if first else first
        except (UpstreamError, asyncio.TimeoutError):
            raise RouterError(
                502,
                f"worker {worker.url} was lost while sending its response",
                type_="server_error",
                code="worker_lost",
                headers=decision_headers(routed),
            ) from None
        return web.Response(status=resp.status, body=body, headers=headers)

    async def _stream(
        self,
        request: web.Request,
        worker: Worker,
        resp: Response,
        headers: CIMultiDict[str],
        started: float,
        label: str,
    ) -> web.StreamResponse:
        # Headers go out at once, so a client sees the stream start before the first token;
        # when that token is already here, they go out with it, in one write.
        kind = _HeldHeaders if resp.has_body() else web.StreamResponse
        out = kind(status=resp.status, headers=headers)
        await out.prepare(request)

        def first() -> None:
            self.metrics.first_byte(label, time.perf_counter() - started)

        await copy_stream(out, resp, worker.url, self.metrics, on_first=first)
        return out


class _HeldHeaders(web.StreamResponse):
    # aiohttp's switch (web.Response's default) to hold the headers until the first body write;
    # an aiohttp without it sends them at once, as StreamResponse does.
    _send_headers_immediately = False


async def copy_stream(
    out: web.StreamResponse,
    content: Body,
    upstream: str,
    metrics: RouterMetrics,
    tail: bytes = b"\n\n",
    on_first: Callable[[], None] | None = None,
) -> None:
    """Pass chunks through as they come; a lost upstream ends the stream with an SSE error event
    and [DONE]. `tail`: the last bytes already written (to close a half-written event)."""
    while True:
        # Only upstream reads are guarded: a client that went away ends the handler.
        try:
            chunk = await content.readany()
        except (aiohttp.ClientError, UpstreamError, asyncio.TimeoutError) as e:
            why = str(e) or type(e).__name__
            log.warning("stream from %s lost: %s", upstream, why)
            metrics.stream_errors.labels(upstream).inc()
            # Close a half-written event first so the error event parses on its own.
            sep = b"" if tail.endswith(b"\n\n") else b"\n\n"
            await out.write(sep + sse_error_event(f"worker {upstream} lost mid-stream: {why}"))
            break
        if not chunk:
            break
        if on_first is not None:
            on_first()
            on_first = None
        if content.is_eof():
            # The last chunk and the stream's end (and the headers, if still held) in one write.
            await out.write_eof(chunk)
            return
        await out.write(chunk)
        tail = (tail + chunk)[-2:]
    await out.write_eof()
