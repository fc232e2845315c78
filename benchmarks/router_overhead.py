"""What a router costs per request, side by side: smetric-router, smg 1.13, sglang-router 0.3.2.

    python -m benchmarks.router_overhead            # 10 s per measurement (~4 min)
    python -m benchmarks.router_overhead --seconds 3

An instant worker: nginx answers `POST /v1/chat/completions` at once with a fixed reply, as JSON
on one port and as an SSE stream (role chunk, content chunk, finish chunk, [DONE]) on another;
every other path (/health, /server_info, /v1/models, /v1/loads, ...) goes to one emulated SGLang
worker, so each router discovers and health-checks a worker that looks like SGLang. `wrk` drives
each target: the worker itself, smetric-router (1 and 2 processes, and with --enable-trace
exporting every request's spans to nginx), smg `cache_aware`,
sglang-router `cache_aware` — req/s at 64 connections (JSON and SSE), latency p50/p99 at 1
connection (the router's added latency = its p50 minus the worker's), and the router's CPU (all
its processes, user+system seconds per wall second) and RSS during the 64-connection JSON run.
Writes benchmarks/results/router_overhead.md. Needs nginx and wrk (apt) and .venv-sglang (smg,
sglang-router; `make sglang`). One run on whatever machine this is: read it as a comparison, not
as absolute capacity (wrk, nginx and the router share its cores).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks.process_cost import tree_cpu_rss
from smetric_router.launch.kinds.sglang import sglang_python
from smetric_router.launch.ports import free_port
from smetric_router.launch.spec import SglangSpec

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "qwen3-coder-30b-a3b-emulated"
REPLY = {"id": "x", "object": "chat.completion", "created": 0, "model": MODEL,
         "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                      "finish_reason": "stop"}],
         "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}}  # fmt: skip


def _chunk(delta: dict[str, str], finish: str | None) -> str:
    c = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
         "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip
    return "data: " + json.dumps(c) + "\\n\\n"


SSE = (_chunk({"role": "assistant", "content": ""}, None) + _chunk({"content": "ok"}, None)
       + _chunk({}, "stop") + "data: [DONE]\\n\\n")  # fmt: skip
NGINX = """
worker_processes 1;
error_log {dir}/error.log warn;
pid {dir}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  upstream emulated {{ server 127.0.0.1:{emulated}; keepalive 16; }}
  server {{
    listen 127.0.0.1:{json_port};
    location = /v1/chat/completions {{ default_type application/json; return 200 '{json}'; }}
    location = /v1/traces {{ return 200; }}
    location / {{ proxy_pass http://emulated; proxy_http_version 1.1;
                  proxy_set_header Connection ""; }}
  }}
  server {{
    listen 127.0.0.1:{sse_port};
    location = /v1/chat/completions {{ default_type text/event-stream; return 200 "{sse}"; }}
    location = /v1/traces {{ return 200; }}
    location / {{ proxy_pass http://emulated; proxy_http_version 1.1;
                  proxy_set_header Connection ""; }}
  }}
}}
"""
WRK_LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{body}'
"""


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    argv: tuple[str, ...]  # {port} and {worker} are filled in; empty: the worker itself


def targets(sglang_py: str) -> list[Target]:
    ours = (sys.executable, "-m", "smetric_router", "--host", "127.0.0.1", "--port", "{port}",
            "--worker-urls", "{worker}", "--policy", "smetric",
            "--log-level", "warning")  # fmt: skip
    peer = ("--host", "127.0.0.1", "--port", "{port}", "--worker-urls", "{worker}",
            "--policy", "cache_aware", "--log-level", "warn")  # fmt: skip
    return [
        Target("worker (nginx, no router)", ()),
        Target("smetric-router (smetric)", ours),
        Target("smetric-router (smetric, --processes 2)", (*ours, "--processes", "2")),
        # admission on with room to spare (64 connections, a cap of 256): what the queue's
        # bookkeeping costs a request that never waits
        Target("smetric-router (smetric) with admission",
               (*ours, "--max-concurrent-requests", "256", "--queue-size", "512",
                "--max-queued-requests-per-worker", "64")),
        # every request's spans exported over OTLP/HTTP, to nginx (it answers /v1/traces 200)
        Target("smetric-router (smetric) --enable-trace",
               ("env", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf", *ours,
                "--enable-trace", "--otlp-traces-endpoint", "{worker}/v1/traces")),
        Target("smg 1.13 (cache_aware)", (sglang_py, "-m", "smg", "launch", *peer)),
        Target("sglang-router 0.3.2 (cache_aware)",
               (sglang_py, "-m", "sglang_router.launch_router", *peer)),
    ]  # fmt: skip


def _wait_chat(url: str, timeout: float = 90) -> None:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
    deadline = time.monotonic() + timeout
    while True:
        try:
            req = urllib.request.Request(url + "/v1/chat/completions", body,
                                         {"Content-Type": "application/json"})  # fmt: skip
            with urllib.request.urlopen(req, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} never answered a chat")
        time.sleep(0.3)


@contextmanager
def process(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield p
    finally:
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(p.pid, signal.SIGKILL)


def wrk(url: str, connections: int, seconds: float, body: str, work: Path) -> dict[str, float]:
    script = work / "post.lua"
    script.write_text(WRK_LUA.format(body=body))
    threads = min(2, connections)
    out = subprocess.run(
        ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{max(1, round(seconds))}s",
         "--latency", "-s", str(script), url + "/v1/chat/completions"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rps = float(_first_group(r"Requests/sec:\s+([\d.]+)", out))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    lat = {q: _us(_first_group(rf"^\s+{q}%\s+(\S+)", out, re.M)) for q in ("50", "99")}
    return {"rps": rps, "p50_us": lat["50"], "p99_us": lat["99"],
            "non2xx": float(errors.group(1)) if errors else 0.0}  # fmt: skip


def _first_group(pattern: str, text: str, flags: int = 0) -> str:
    """Group 1 of pattern's first match in wrk's report (which always prints these lines)."""
    m = re.search(pattern, text, flags)
    assert m, (pattern, text)
    return m.group(1)


def _us(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    assert m, text
    return float(m.group(1)) * {"us": 1.0, "ms": 1e3, "s": 1e6}[m.group(2)]


def measure(t: Target, ports: dict[str, int], seconds: float, work: Path) -> dict[str, float]:
    # ignore_eos: every request the same length, so the rows compare like with like
    json_body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                            "max_tokens": 8, "ignore_eos": True})  # fmt: skip
    sse_body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": 8, "ignore_eos": True, "stream": True})  # fmt: skip
    rows: dict[str, float] = {}
    for kind, worker_port, body in (("json", ports["json"], json_body),
                                    ("sse", ports["sse"], sse_body)):  # fmt: skip
        worker = f"http://127.0.0.1:{worker_port}"
        if not t.argv:
            url, ctx = worker, None
        else:
            port = free_port()
            argv = [a.format(port=port, worker=worker) for a in t.argv]
            ctx = process(argv, work / f"{t.name.split()[0]}-{kind}.log")
            url = f"http://127.0.0.1:{port}"
        with ctx if ctx is not None else _nothing() as proc:
            _wait_chat(url)
            wrk(url, 64, 2, body, work)  # warm-up: connections, caches
            cpu0, _ = tree_cpu_rss(proc.pid) if proc is not None else (0.0, 0)
            start = time.monotonic()
            r = wrk(url, 64, seconds, body, work)
            cpu1, rss = tree_cpu_rss(proc.pid) if proc is not None else (0.0, 0)
            rows[f"{kind}_rps"] = r["rps"]
            rows[f"{kind}_non2xx"] = r["non2xx"]
            if kind == "json":
                rows["cpu"] = (cpu1 - cpu0) / (time.monotonic() - start)
                rows["rss_mb"] = rss / 2**20
                one = wrk(url, 1, seconds, body, work)
                rows["p50_us"], rows["p99_us"] = one["p50_us"], one["p99_us"]
    return rows


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


def write(results: dict[str, dict[str, float]], seconds: float, out: str) -> None:
    base = results["worker (nginx, no router)"]
    lines = [
        "# Router overhead: smetric-router, smg, sglang-router in front of an instant worker",
        "",
        f"`python -m benchmarks.router_overhead --seconds {seconds:g}` (wrk; nginx answers chat "
        "completions at once, as JSON or SSE; one run, this 2-core machine, wrk, nginx and the "
        "router sharing it).",
        "",
        "| target | JSON req/s (c=64) | SSE req/s (c=64) | p50 (c=1) | p99 (c=1) | added p50 | "
        "router CPU (cores) | router RSS |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        added = "—" if r is base else f"+{r['p50_us'] - base['p50_us']:.0f} µs"
        cpu = "—" if r is base else f"{r['cpu']:.2f}"
        rss = "—" if r is base else f"{r['rss_mb']:.0f} MB"
        errors = r["json_non2xx"] + r["sse_non2xx"]
        note = f" ({errors:.0f} non-2xx)" if errors else ""
        lines.append(
            f"| {name}{note} | {r['json_rps']:,.0f} | {r['sse_rps']:,.0f} | "
            f"{r['p50_us']:.0f} µs | {r['p99_us']:.0f} µs | {added} | {cpu} | {rss} |"
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each wrk run")
    ap.add_argument("--only", default="", help="comma-separated target name prefixes")
    ap.add_argument("--out", default="router_overhead.md", help="file under benchmarks/results/")
    a = ap.parse_args()
    for tool in ("nginx", "wrk"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found: apt-get install -y nginx-light wrk")
    sglang_py = sglang_python(SglangSpec())
    work = Path(tempfile.mkdtemp(prefix="smetric-overhead-"))
    ports = {"emulated": free_port(), "json": free_port(), "sse": free_port()}
    (work / "nginx.conf").write_text(NGINX.format(
        dir=work, emulated=ports["emulated"], json_port=ports["json"], sse_port=ports["sse"],
        json=json.dumps(REPLY), sse=SSE.replace('"', '\\"')))  # fmt: skip
    emulated = [sys.executable, "-m", "smetric_router.emulator", "--port", str(ports["emulated"]),
                "--model-name", MODEL, "--page-size", "16", "--log-level", "warning"]  # fmt: skip
    nginx = ["nginx", "-p", str(work), "-c", str(work / "nginx.conf"), "-g", "daemon off;"]
    results: dict[str, dict[str, float]] = {}
    with process(emulated, work / "emulated.log"), process(nginx, work / "nginx.log"):
        for t in targets(sglang_py):
            if a.only and not any(t.name.startswith(p) for p in a.only.split(",")):
                continue
            results[t.name] = measure(t, ports, a.seconds, work)
            print(t.name, results[t.name], flush=True)
    write(results, a.seconds, a.out)


if __name__ == "__main__":
    main()
