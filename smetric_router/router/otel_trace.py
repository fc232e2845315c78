"""OpenTelemetry behind core/tracing.py, for `--enable-trace` (the `trace` extra).

Imported only when tracing is turned on. The exporter is chosen as SGLang 0.5.23 chooses it
(sglang/srt/observability/trace.py): $OTEL_EXPORTER_OTLP_TRACES_PROTOCOL `grpc` (the default;
the endpoint is host:port, plaintext) or `http/protobuf` (the endpoint is the full
http://host:port/v1/traces URL). Spans are batched off the event loop (BatchSpanProcessor; its
OTEL_BSP_* variables apply). Trace context goes in and out as W3C `traceparent`/`tracestate`, the
headers SGLang's HTTP server reads (`extract_trace_headers`), so a worker started with
`--enable-trace` puts its request spans under the router's span for that request.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import TypeVar

from aiohttp import web

from smetric_router.core import tracing
from smetric_router.core.tracing import AttrValue

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"--enable-trace needs the OpenTelemetry SDK and OTLP exporters ({e.name} is missing): "
        "pip install 'smetric-router[trace]'"
    ) from e

T = TypeVar("T")
log = logging.getLogger(__name__)

PROTOCOL_ENV = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
PROTOCOLS = ("grpc", "http/protobuf")
DEFAULT_SERVICE_NAME = "smetric-router"
# Probes and scrapes: no span (a trace per health check buries the requests).
UNTRACED_PATHS = frozenset({"/health", "/liveness", "/readiness", "/metrics"})
SHUTDOWN_BOUND_S = 5.0

_PROPAGATOR = TraceContextTextMapPropagator()
_provider: TracerProvider | None = None
_tracer: trace.Tracer | None = None


def _clean(attrs: Mapping[str, AttrValue | None] | None) -> dict[str, AttrValue]:
    return {k: v for k, v in attrs.items() if v is not None} if attrs else {}


class OtelSpan(tracing.Span):
    __slots__ = ("_current", "_span", "_token")

    def __init__(self, span: trace.Span, current: bool) -> None:
        self._span = span
        self._current = current
        self._token: object | None = None

    def __enter__(self) -> OtelSpan:
        if self._current:
            self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            if isinstance(exc, asyncio.CancelledError):
                self.set("smetric.cancelled", True)
            elif self._span.is_recording():
                self._span.record_exception(exc)
                self.fail(str(exc) or type(exc).__name__)
        if self._token is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]
            self._token = None
        self.end()

    # (an ended span takes nothing more: the SDK would warn)
    def set(self, key: str, value: AttrValue | None) -> None:
        if value is not None and self._span.is_recording():
            self._span.set_attribute(key, value)

    def set_many(self, attrs: Mapping[str, AttrValue | None]) -> None:
        if self._span.is_recording():
            self._span.set_attributes(_clean(attrs))

    def event(self, name: str, attrs: Mapping[str, AttrValue] | None = None) -> None:
        if self._span.is_recording():
            self._span.add_event(name, dict(attrs) if attrs else None)

    def fail(self, why: str) -> None:
        if self._span.is_recording():
            self._span.set_status(Status(StatusCode.ERROR, why))

    def end(self) -> None:
        if self._span.is_recording():
            self._span.end()

    def trace_lines(self) -> bytes:
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, trace.set_span_in_context(self._span))
        return b"".join(
            b"%s: %s\r\n" % (k.encode(), v.encode("latin-1")) for k, v in carrier.items()
        )

    @property
    def otel(self) -> trace.Span:
        return self._span


def _span(name: str, attrs: Mapping[str, AttrValue | None] | None = None) -> tracing.Span:
    assert _tracer is not None
    return OtelSpan(_tracer.start_span(name, attributes=_clean(attrs)), current=True)


def _client_span(
    name: str,
    attrs: Mapping[str, AttrValue | None] | None = None,
    parent: tracing.Span | None = None,
) -> tracing.Span:
    assert _tracer is not None
    ctx = trace.set_span_in_context(parent.otel) if isinstance(parent, OtelSpan) else None
    span = _tracer.start_span(name, context=ctx, kind=SpanKind.CLIENT, attributes=_clean(attrs))
    return OtelSpan(span, current=False)


def _in_context(fn: Callable[..., T]) -> Callable[..., T]:
    return functools.partial(contextvars.copy_context().run, fn)


def _current_trace_id() -> str | None:
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None


def exporter(endpoint: str, protocol: str | None = None) -> SpanExporter:
    """The OTLP span exporter SGLang would make for this endpoint and protocol."""
    protocol = protocol or os.environ.get(PROTOCOL_ENV) or "grpc"
    if protocol not in PROTOCOLS:
        raise ValueError(
            f"{PROTOCOL_ENV}={protocol!r} is not supported: use one of {', '.join(PROTOCOLS)}"
        )
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter(endpoint=endpoint, insecure=True)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter(endpoint=endpoint)


def install(endpoint: str, service_name: str | None, protocol: str | None = None) -> None:
    """Turn tracing on in this process (once; later calls change nothing)."""
    global _provider, _tracer
    if _provider is not None:
        return
    name = service_name or os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))
    provider.add_span_processor(BatchSpanProcessor(exporter(endpoint, protocol)))
    _provider, _tracer = provider, provider.get_tracer("smetric_router")
    tracing._set("span", _span)
    tracing._set("client_span", _client_span)
    tracing._set("in_context", _in_context)
    tracing._set("current_trace_id", _current_trace_id)
    tracing._set("enabled", True)


def shutdown() -> None:
    """Export what is pending, within SHUTDOWN_BOUND_S (a collector that is down must not hold
    the router's exit)."""
    provider = _provider
    if provider is None:
        return
    done = threading.Thread(target=provider.shutdown, name="smetric-trace-shutdown", daemon=True)
    done.start()
    done.join(SHUTDOWN_BOUND_S)
    if done.is_alive():
        log.warning("trace export did not finish within %.0f s at exit", SHUTDOWN_BOUND_S)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def server_span(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The router's server span for one request: a child of the client's `traceparent` when it
    sends one, the root of a new trace otherwise."""
    if request.path in UNTRACED_PATHS:
        return await handler(request)
    assert _tracer is not None
    route = request.match_info.route.resource
    template = route.canonical if route is not None else request.path
    parent = _PROPAGATOR.extract(request.headers)
    span = _tracer.start_span(
        f"{request.method} {template}",
        context=parent,
        kind=SpanKind.SERVER,
        attributes={
            "http.request.method": request.method,
            "http.route": template,
            "url.path": request.path,
            "network.peer.address": request.remote or "",
        },
    )
    token = otel_context.attach(trace.set_span_in_context(span))
    status = 499  # stays so when the client went away first
    try:
        resp = await handler(request)
        status = resp.status
        return resp
    except web.HTTPException as e:
        status = e.status
        raise
    except asyncio.CancelledError:
        span.set_attribute("smetric.cancelled", True)
        raise
    except BaseException as e:
        status = 500
        span.record_exception(e)
        raise
    finally:
        span.set_attribute("http.response.status_code", status)
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
        otel_context.detach(token)
        span.end()
