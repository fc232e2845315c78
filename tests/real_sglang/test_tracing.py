"""A traced router in front of a real SGLang 0.5.23 worker started with `--enable-trace`: both
export to one OTLP collector in the test, and each request is one trace holding the router's
spans and SGLang's (SGLang's HTTP server reads the traceparent the router sends,
tokenizer_manager's extract_trace_headers, and starts its request span under it)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from functools import partial

import pytest

from smetric_router.launch import ClusterSpec, RouterSpec, SglangSpec, Stack, WorkerSpec
from tests.helpers.otlp import SERVER, OtlpHttpReceiver, Span, otlp_http
from tests.helpers.polling import eventually_sync
from tests.real_sglang.conftest import MAX_TOTAL_TOKENS, MODEL, ROUTER_ARGS, require_sglang_env

pytestmark = pytest.mark.sglang

ROUTER_SERVICE = "router-traced"
WORKER_SERVICE = "sglang-traced"
EXPORT_ENV = {
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",  # read by the router and by SGLang
    "OTEL_BSP_SCHEDULE_DELAY": "100",  # the router's batches
}


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpHttpReceiver]:
    with otlp_http() as r:
        yield r


@pytest.fixture(scope="module")
def traced(receiver: OtlpHttpReceiver) -> Iterator[Stack]:
    require_sglang_env()
    trace = ("--enable-trace", "--otlp-traces-endpoint", receiver.endpoint)
    spec = ClusterSpec(
        router=RouterSpec(
            port=0,
            extra_args=(*ROUTER_ARGS, *trace, "--otlp-service-name", ROUTER_SERVICE),
        ),
        workers=WorkerSpec(
            kind="sglang",
            count=1,
            page_size=16,
            extra_args=(*trace, "--otlp-service-name", WORKER_SERVICE),
        ),
        sglang=SglangSpec(
            max_total_tokens=MAX_TOTAL_TOKENS,
            hicache=False,
            env=(
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
                ("SGLANG_OTLP_EXPORTER_SCHEDULE_DELAY_MILLIS", "100"),
            ),
        ),
    )
    with pytest.MonkeyPatch.context() as mp:
        for k, v in EXPORT_ENV.items():
            mp.setenv(k, v)
        with Stack(spec) as stack:
            yield stack


def joined(got: OtlpHttpReceiver, trace_id: str) -> list[Span]:
    """The trace once it holds the router's server span and SGLang's root span under a router
    span. SGLang exports a span when it ends, so its child spans (request_process, ...) can
    arrive in a batch before the root that encloses them."""
    spans = got.trace(trace_id)
    router_ids = {s.span_id for s in spans if s.service == ROUTER_SERVICE}
    router_done = any(s.service == ROUTER_SERVICE and s.kind == SERVER for s in spans)
    rooted = any(s.service == WORKER_SERVICE and s.parent_id in router_ids for s in spans)
    return spans if router_done and rooted else []


def test_router_and_sglang_spans_share_one_trace_per_request(
    traced: Stack, receiver: OtlpHttpReceiver
) -> None:
    for i, trace_id in enumerate(("a" * 32, "b" * 32)):
        prompt = f"Request {i}: say something."
        body = {"model": MODEL, "max_tokens": 4,
                "messages": [{"role": "user", "content": prompt}]}  # fmt: skip
        req = urllib.request.Request(
            traced.url + "/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={
                "Content-Type": "application/json",
                "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01",
            },
        )
        with urllib.request.urlopen(req, timeout=120) as r:
            assert r.status == 200
        spans = eventually_sync(partial(joined, receiver, trace_id), f"request {i}'s trace", 60)
        upstream = next(s for s in spans if s.service == ROUTER_SERVICE and s.name == "upstream")
        # SGLang's request span (its root, "Req <rid>") is a child of the router's attempt span
        sglang_roots = [
            s for s in spans if s.service == WORKER_SERVICE and s.parent_id == upstream.span_id
        ]
        assert sglang_roots, [(s.service, s.name, s.parent_id) for s in spans]
        assert all(s.name.strip().startswith("Req ") for s in sglang_roots), sglang_roots
