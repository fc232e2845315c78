"""Request tracing as the rest of the code sees it: a no-op until `--enable-trace` turns it on.

Call sites use this module's functions (`tracing.span(...)`, `tracing.in_context(...)`) and its
`enabled` flag. Off, which is the default, `span` hands back one shared do-nothing span and
nothing of OpenTelemetry is imported: a request pays a function call and an empty `with` per
span. `router/otel_trace.py` (imported only by `enable`) swaps in the OpenTelemetry versions
once per process, before the first request.

Attributes that cost something to compute (a decision's loads, say) are built only under
`if tracing.enabled:`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

T = TypeVar("T")
AttrValue = str | bool | int | float | Sequence[str] | Sequence[int] | Sequence[float]


class Span:
    """A span, or the no-op one (this class): all methods do nothing, `trace_lines` is empty."""

    __slots__ = ()

    def __enter__(self) -> Span:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def set(self, key: str, value: AttrValue | None) -> None:
        """One attribute; None leaves it out."""

    def set_many(self, attrs: Mapping[str, AttrValue | None]) -> None:
        """Attributes; None values are left out."""

    def event(self, name: str, attrs: Mapping[str, AttrValue] | None = None) -> None:
        """A timestamped event on the span."""

    def fail(self, why: str) -> None:
        """Mark the span failed (status ERROR), with why."""

    def end(self) -> None:
        """End a span started without `with`; ending twice is harmless."""

    def trace_lines(self) -> bytes:
        """W3C trace-context header lines (`traceparent: ...\\r\\n`, and `tracestate` when
        there is one) naming this span as the parent of what the request they go on does."""
        return b""


NO_SPAN = Span()

# True once enable() has run in this process.
enabled = False


def span(name: str, attrs: Mapping[str, AttrValue | None] | None = None) -> Span:
    """An internal span, child of the current one; as a context manager it is the current span
    while the block runs and ends with it."""
    return NO_SPAN


def client_span(
    name: str, attrs: Mapping[str, AttrValue | None] | None = None, parent: Span | None = None
) -> Span:
    """A client span (a request to a worker), child of `parent` or of the current span. Not made
    current: end it with end() or `with`; its trace_lines() go on the request."""
    return NO_SPAN


def in_context(fn: Callable[..., T]) -> Callable[..., T]:
    """fn, to be run in another thread under the current span (contextvars do not cross
    run_in_executor by themselves)."""
    return fn


def current_trace_id() -> str | None:
    """The current span's trace id (32 hex digits), None outside a trace."""
    return None


def enable(endpoint: str, service_name: str | None, protocol: str | None = None) -> None:
    """Turn tracing on for this process: spans go by OTLP to `endpoint` (protocol: grpc or
    http/protobuf; None = $OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else grpc). Raises ValueError
    when the OpenTelemetry packages are missing (the `trace` extra) or the protocol is unknown."""
    try:
        from smetric_router.router import otel_trace
    except ImportError as e:  # said as a start-up error, as a bad flag is
        raise ValueError(str(e)) from None
    otel_trace.install(endpoint, service_name, protocol)


def shutdown() -> None:
    """Export what is pending and stop (on the way out); nothing when tracing is off."""
    if enabled:
        from smetric_router.router import otel_trace

        otel_trace.shutdown()


class TraceIdFilter(logging.Filter):
    """Puts the current trace id on each record, as `%(trace_id)s` ("-" outside a trace)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.trace_id = current_trace_id() or "-"
        return True


def log_trace_ids(fmt: str) -> None:
    """The root logger's handlers print each record's trace id: `fmt` is their new format."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(TraceIdFilter())
        handler.setFormatter(logging.Formatter(fmt))


def _set(name: str, value: Any) -> None:
    """Replace one of this module's functions (otel_trace.install)."""
    globals()[name] = value
