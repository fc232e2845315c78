"""An OTLP trace collector for tests: what the router (and SGLang) export, decoded.

`OtlpHttpReceiver` takes `POST /v1/traces` (OTLP/HTTP, protobuf) on 127.0.0.1; `OtlpGrpcReceiver`
serves OTLP/gRPC's TraceService.Export with grpcio's generic handlers. Both decode with the OTLP
protobuf definitions (opentelemetry-proto) and keep every span as a `Span`: ids in hex, attributes
as Python values, the exporting service's name, its events. Each runs in threads of its own, so
a synchronous test can wait on it as well as an async one.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanPb

SERVER = SpanPb.SpanKind.SPAN_KIND_SERVER
CLIENT = SpanPb.SpanKind.SPAN_KIND_CLIENT
INTERNAL = SpanPb.SpanKind.SPAN_KIND_INTERNAL
STATUS_ERROR = 2  # Status.StatusCode.STATUS_CODE_ERROR


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return _attrs(v.kvlist_value.values)
    return getattr(v, kind)


def _attrs(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    kv: KeyValue
    for kv in kvs:
        out[kv.key] = _value(kv.value)
    return out


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_id: str  # "" for a root
    kind: int
    attrs: dict[str, Any]
    events: tuple[str, ...]
    status: int  # 0 unset, 1 ok, 2 error
    start_ns: int
    end_ns: int


@dataclass
class Collected:
    """Every span received, and every request (one per export)."""

    spans: list[Span] = field(default_factory=list)
    exports: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, request: ExportTraceServiceRequest) -> None:
        got = []
        for rs in request.resource_spans:
            service = str(_attrs(rs.resource.attributes).get("service.name", ""))
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(
                        Span(
                            service=service,
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            kind=s.kind,
                            attrs=_attrs(s.attributes),
                            events=tuple(e.name for e in s.events),
                            status=s.status.code,
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                        )
                    )
        with self.lock:
            self.spans.extend(got)
            self.exports += 1

    def all(self) -> list[Span]:
        with self.lock:
            return list(self.spans)

    def trace(self, trace_id: str) -> list[Span]:
        return [s for s in self.all() if s.trace_id == trace_id]


class OtlpHttpReceiver(Collected):
    """OTLP/HTTP (protobuf) on 127.0.0.1: `endpoint` is the URL an exporter is given."""

    def __init__(self) -> None:
        super().__init__()
        collected = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                if self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_error(415)
                    return
                collected.add(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self.endpoint = f"http://127.0.0.1:{self.port}/v1/traces"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> OtlpHttpReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


class OtlpGrpcReceiver(Collected):
    """OTLP/gRPC on 127.0.0.1 (plaintext): `endpoint` is the host:port an exporter is given."""

    def __init__(self) -> None:
        import grpc

        super().__init__()

        def export(request: ExportTraceServiceRequest, _: Any) -> ExportTraceServiceResponse:
            self.add(request)
            return ExportTraceServiceResponse()

        handler = grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Export": grpc.unary_unary_rpc_method_handler(
                    export,
                    request_deserializer=ExportTraceServiceRequest.FromString,
                    response_serializer=ExportTraceServiceResponse.SerializeToString,
                )
            },
        )
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self._server.add_generic_rpc_handlers((handler,))
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"127.0.0.1:{self.port}"

    def start(self) -> OtlpGrpcReceiver:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None)


@contextlib.contextmanager
def otlp_http() -> Iterator[OtlpHttpReceiver]:
    r = OtlpHttpReceiver().start()
    try:
        yield r
    finally:
        r.stop()


@contextlib.contextmanager
def otlp_grpc() -> Iterator[OtlpGrpcReceiver]:
    r = OtlpGrpcReceiver().start()
    try:
        yield r
    finally:
        r.stop()
