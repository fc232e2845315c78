"""--enable-trace end to end: the router as its own process exports its spans over OTLP to a
collector in the test (tests/helpers/otlp.py), and hands its trace context to the workers.

Emulated workers (the launcher's stack) show the decision in the spans matching the decision
headers; in-test fake workers (tests/router/fakes.py) show what a worker receives (traceparent)
and retries. Off, the router imports nothing of OpenTelemetry and sends nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from smetric_router.launch import ClusterSpec, RouterSpec, Stack, WorkerSpec
from smetric_router.router.proxy import HIT_HEADER, REASON_HEADER, TIER_HEADER, WORKER_HEADER
from tests.e2e.conftest import ROUTER_ARGS, SPEEDUP
from tests.helpers.otlp import (
    CLIENT,
    SERVER,
    STATUS_ERROR,
    Collected,
    OtlpHttpReceiver,
    Span,
    otlp_grpc,
    otlp_http,
)
from tests.helpers.polling import eventually, eventually_sync
from tests.helpers.router_process import router_process
from tests.router.fakes import FakeWorker

PROTOCOL_ENV = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
# spans leave the router every 100 ms instead of every 5 s
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}
HTTP_EXPORT = {**FAST_EXPORT, PROTOCOL_ENV: "http/protobuf"}
SERVICE = "router-under-test"
ROUTER_SPANS = ("read_body", "features", "route", "upstream")


def traceparent(trace_id: str, parent: str = "00f067aa0ba902b7") -> str:
    return f"00-{trace_id}-{parent}-01"


def parse_traceparent(value: str) -> tuple[str, str]:
    """(trace id, parent span id) of a W3C traceparent."""
    version, trace_id, parent, _flags = value.split("-")
    assert version == "00" and len(trace_id) == 32 and len(parent) == 16, value
    return trace_id, parent


def router_trace(
    got: Collected, trace_id: str, names: tuple[str, ...] = ROUTER_SPANS
) -> list[Span]:
    """The router's spans of one trace, once the server span and `names` have all arrived."""
    spans = [s for s in got.trace(trace_id) if s.service == SERVICE]
    have = {s.name for s in spans}
    server = [s for s in spans if s.kind == SERVER]
    return spans if server and set(names) <= have else []


def one(spans: list[Span], name: str) -> Span:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


def header(headers: dict[str, str], name: str) -> str | None:
    return next((v for k, v in headers.items() if k.lower() == name), None)


# Emulated workers: the decision in the spans ----------------------------------------------------


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpHttpReceiver]:
    with otlp_http() as r:
        yield r


@pytest.fixture(scope="module")
def traced_stack(receiver: OtlpHttpReceiver) -> Iterator[Stack]:
    args = ("--enable-trace", "--otlp-traces-endpoint", receiver.endpoint,
            "--otlp-service-name", SERVICE)  # fmt: skip
    spec = ClusterSpec(
        router=RouterSpec(port=0, extra_args=(*ROUTER_ARGS, *args)),
        workers=WorkerSpec(count=2, speedup=SPEEDUP),
    )
    with pytest.MonkeyPatch.context() as mp:
        for k, v in HTTP_EXPORT.items():
            mp.setenv(k, v)
        with Stack(spec) as stack:
            yield stack


def chat(url: str, body: dict[str, Any], trace_id: str) -> tuple[dict[str, str], bytes]:
    req = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "traceparent": traceparent(trace_id)},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return dict(r.headers.items()), r.read()


def test_each_chat_request_is_one_trace_whose_decision_matches_the_headers(
    traced_stack: Stack, receiver: OtlpHttpReceiver
) -> None:
    messages: list[dict[str, str]] = [{"role": "user", "content": "Tell me about KV caches. " * 20}]
    for turn, trace_id in enumerate(("1" * 32, "2" * 32)):
        stream = turn == 1
        body = {"model": "m", "messages": messages, "max_tokens": 8, "stream": stream}
        headers, raw = chat(traced_stack.url, body, trace_id)
        spans = eventually_sync(partial(router_trace, receiver, trace_id), f"turn {turn}'s spans")

        server = next(s for s in spans if s.kind == SERVER)
        # the client's trace is kept: the router's span is a child of the client's
        assert server.parent_id == "00f067aa0ba902b7"
        assert server.name == "POST /v1/chat/completions"
        assert server.attrs["http.route"] == "/v1/chat/completions"
        assert server.attrs["http.response.status_code"] == 200
        for name in ROUTER_SPANS:
            assert one(spans, name).parent_id == server.span_id, name
        features = one(spans, "features")
        assert {"render", "tokenize_hash"} <= {
            s.name for s in spans if s.parent_id == features.span_id
        }
        assert features.attrs["smetric.turn"] == turn

        route = one(spans, "route").attrs
        assert route["smetric.policy"] == "smetric"
        assert route["smetric.worker"] == header(headers, WORKER_HEADER)
        assert route["smetric.reason"] == header(headers, REASON_HEADER)
        hit = f"gpu={route['smetric.hit.gpu']}; host={route['smetric.hit.host']}; "
        hit += f"l3={route['smetric.hit.l3']}"
        assert hit == header(headers, HIT_HEADER)
        assert route["smetric.tier"] == header(headers, TIER_HEADER)
        assert route["smetric.turn"] == turn
        assert route["smetric.candidates"] == 2
        assert {"smetric.est_hit", "smetric.worker_load", "smetric.mean_load"} <= set(route)

        upstream = one(spans, "upstream")
        assert upstream.kind == CLIENT
        assert upstream.attrs["smetric.worker"] == header(headers, WORKER_HEADER)
        assert upstream.attrs["url.full"].endswith("/v1/chat/completions")
        assert upstream.attrs["http.response.status_code"] == 200
        assert "first_byte" in upstream.events
        assert server.start_ns <= upstream.start_ns <= upstream.end_ns <= server.end_ns

        reply = raw.decode()
        if stream:
            text = "".join(
                c["choices"][0]["delta"].get("content") or ""
                for line in reply.splitlines()
                if line.startswith("data: {") and (c := json.loads(line[6:]))["choices"]
            )
        else:
            text = json.loads(reply)["choices"][0]["message"]["content"]
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "More."}]


# Fake workers: what a worker receives, retries ---------------------------------------------------


async def post_chat(url: str, trace_id: str | None = None) -> aiohttp.ClientResponse:
    headers = {"traceparent": traceparent(trace_id)} if trace_id else {}
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/v1/chat/completions", json=body, headers=headers) as r,
    ):
        await r.read()
        return r


def traced_args(endpoint: str, *workers: FakeWorker) -> list[str]:
    return ["--worker-urls", *(w.url for w in workers), "--enable-trace",
            "--otlp-traces-endpoint", endpoint, "--otlp-service-name", SERVICE,
            "--log-level", "warning"]  # fmt: skip


async def test_the_worker_gets_a_traceparent_of_the_same_trace_naming_the_attempt(
    tmp_path: Path,
) -> None:
    workers = [await FakeWorker(f"w{i}").start() for i in range(2)]
    try:
        with otlp_http() as got:
            args = traced_args(got.endpoint, *workers)
            async with router_process(args, tmp_path / "ports.json", HTTP_EXPORT) as url:
                trace_id = "3" * 32
                r = await post_chat(url, trace_id)
                assert r.status == 200
                spans = await eventually(lambda: router_trace(got, trace_id), "the spans")
    finally:
        for w in workers:
            await w.close()
    received = [h for w in workers for h in w.headers]
    assert len(received) == 1
    sent = header(received[0], "traceparent")
    assert sent is not None
    # the same trace; its parent is the router's attempt span, not the client's span
    assert parse_traceparent(sent) == (trace_id, one(spans, "upstream").span_id)


async def test_retries_are_sibling_attempt_spans(tmp_path: Path) -> None:
    workers = [await FakeWorker(f"w{i}").start() for i in range(2)]
    urls = {w.url: w for w in workers}
    for w in workers:
        w.fail_next = 1  # each answers its first request 503: two attempts, the last relayed
    log = tmp_path / "router.log"
    try:
        with otlp_http() as got:
            args = [*traced_args(got.endpoint, *workers), "--max-retries", "1"]
            async with router_process(args, tmp_path / "ports.json", HTTP_EXPORT, log) as url:
                trace_id = "4" * 32
                r = await post_chat(url, trace_id)
                assert r.status == 503

                def two_attempts() -> list[Span]:
                    spans = router_trace(got, trace_id)
                    return spans if len([s for s in spans if s.name == "upstream"]) == 2 else []

                spans = await eventually(two_attempts, "both attempts' spans")
    finally:
        for w in workers:
            await w.close()
    server = next(s for s in spans if s.kind == SERVER)
    attempts = sorted((s for s in spans if s.name == "upstream"), key=lambda s: s.start_ns)
    assert [a.parent_id for a in attempts] == [server.span_id] * 2
    assert [a.attrs["smetric.retry"] for a in attempts] == [0, 1]
    assert {a.attrs["smetric.worker"] for a in attempts} == set(urls)
    assert [a.status for a in attempts] == [STATUS_ERROR] * 2
    assert attempts[0].end_ns <= attempts[1].start_ns
    assert server.attrs["http.response.status_code"] == 503
    # each worker was told its own attempt's span
    by_worker = {a.attrs["smetric.worker"]: a.span_id for a in attempts}
    for url, w in urls.items():
        sent = header(w.headers[0], "traceparent")
        assert sent is not None and parse_traceparent(sent) == (trace_id, by_worker[url])
    # the router's log line about the retry names the request's trace
    retry_lines = [line for line in log.read_text().splitlines() if "retrying away" in line]
    assert len(retry_lines) == 1 and f"[trace_id={trace_id}]" in retry_lines[0], retry_lines


async def test_grpc_is_the_default_protocol(tmp_path: Path) -> None:
    worker = await FakeWorker("w").start()
    try:
        with otlp_grpc() as got:
            args = traced_args(got.endpoint, worker)
            with pytest.MonkeyPatch.context() as mp:
                mp.delenv(PROTOCOL_ENV, raising=False)
                async with router_process(args, tmp_path / "ports.json", FAST_EXPORT) as url:
                    r = await post_chat(url)  # no traceparent: the router's span is a root
                    assert r.status == 200

                    def root() -> Span | None:
                        return next(
                            (s for s in got.all() if s.kind == SERVER and not s.parent_id), None
                        )

                    server = await eventually(root, "a root server span over gRPC")
    finally:
        await worker.close()
    assert {s.name for s in got.trace(server.trace_id)} >= set(ROUTER_SPANS)
    sent = header(worker.headers[0], "traceparent")
    assert sent is not None and parse_traceparent(sent)[0] == server.trace_id


# Off ---------------------------------------------------------------------------------------------


async def test_off_the_router_sends_nothing_and_passes_the_clients_traceparent(
    tmp_path: Path,
) -> None:
    workers = [await FakeWorker(f"w{i}").start() for i in range(2)]
    try:
        with otlp_http() as got:
            off_args = ["--worker-urls", workers[0].url, "--log-level", "warning",
                        "--otlp-traces-endpoint", got.endpoint]  # fmt: skip
            async with (
                router_process(off_args, tmp_path / "off.json", HTTP_EXPORT) as off,
                router_process(
                    traced_args(got.endpoint, workers[1]), tmp_path / "on.json", HTTP_EXPORT
                ) as on,
            ):
                assert (await post_chat(off, "5" * 32)).status == 200
                assert (await post_chat(on, "6" * 32)).status == 200
                # the traced router's spans arrive; the other one's never do
                await eventually(lambda: router_trace(got, "6" * 32), "the traced router's spans")
    finally:
        for w in workers:
            await w.close()
    assert got.trace("5" * 32) == []
    assert {s.service for s in got.all()} == {SERVICE}
    # off, the client's trace context goes to the worker as it came
    assert header(workers[0].headers[0], "traceparent") == traceparent("5" * 32)


OFF_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys, tempfile
    from pathlib import Path
    import aiohttp
    from smetric_router.core.port_file import read_port_file
    from smetric_router.router.cli import config_from_args
    from smetric_router.router.serve import serve
    from tests.router.fakes import FakeWorker

    async def main():
        worker = await FakeWorker("w").start()
        port_file = Path(tempfile.mkdtemp()) / "ports.json"
        config = config_from_args(["--port", "0", "--worker-urls", worker.url])
        task = asyncio.create_task(serve(config, str(port_file)))
        while read_port_file(port_file) is None:
            await asyncio.sleep(0.05)
        url = f"http://127.0.0.1:{read_port_file(port_file)['http']}"
        body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
        headers = {"traceparent": "00-" + "7" * 32 + "-00f067aa0ba902b7-01"}
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
                assert r.status == 200, r.status
                await r.read()
        task.cancel()
        await worker.close()
        print(json.dumps(sorted(m for m in sys.modules if m.startswith("opentelemetry"))))

    asyncio.run(main())
    """
)


def test_off_no_opentelemetry_module_is_imported() -> None:
    """A request served end to end with tracing off, in a process of its own."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", OFF_SCRIPT], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
