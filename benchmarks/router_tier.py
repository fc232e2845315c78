"""The router tier: router replicas behind a TCP load balancer (HAProxy) versus one router.

    python -m benchmarks.router_tier              # 3 workers, 3 replicas, ~2 min of wall time
    python -m benchmarks.router_tier --smoke      # 2 workers, 2 replicas, 14 sessions (the test's)

One set of emulated workers (the launcher's, `smetric_router.launch`). Phase `one`: a single router
in front of them. Phase `tier`: `--replicas` router processes on their own free ports (separate
processes, not `--processes`: nothing shared between them but the workers) behind one HAProxy in
TCP mode (what a Kubernetes Service is: L4, one backend per connection), `balance roundrobin`,
`option httpchk GET /readiness`. Every request opens its own connection, so the turns of one
session are spread over the replicas: a follow-up is decided by another replica than its session's
previous turn. Each phase starts from flushed worker caches and replays the same agent sessions
(shared system prompt, a task, then tool results; Poisson session arrivals, turns in sequence,
streamed replies).

Reported per phase: requests, failed requests, the workers' cached share of prompt tokens (their
/metrics counters), the share of follow-ups decided `sticky` (the router's x-smetric-reason
header), the share that ran on their previous turn's worker (x-smetric-worker), TTFT p50/p90.

Phase `restart` (tier again): one replica is killed (SIGKILL, a crash) mid-run and started again at
once on its port, as a kubelet restarts a container. Reported: requests that failed (a client
retries a failed request once, after 0.2 s), when HAProxy's check took the replica out, when it
answered /readiness again and when HAProxy put it back.

HAProxy must be installed (Debian: `apt-get install -y haproxy`; `make test-tools` does it); this
script installs nothing. Emulated workers model an H20's timing in real time on this machine's CPUs:
times are modelled engine time plus this machine's Python overheads, not GPU measurements.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.compare import token_counters
from smetric_router.launch import ClusterSpec, Stack, WorkerSpec, free_port, router_args

RESULTS = Path(__file__).resolve().parent / "results"
STICKY = ("sticky", "sticky-l3")
HAPROXY_HINT = (
    "haproxy not found: install it (Debian: apt-get install -y haproxy, or make test-tools)"
)
SYSTEM_PROMPT = (
    "You are a coding agent. You read files, run tools and edit code until the task is done. "
    "Answer with one tool call or a short explanation. "
) * 10
_VOCAB = ("read", "file", "src", "main", "test", "error", "line", "def", "class", "return",
          "import", "value", "config", "patch")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Setup:
    workers: int = 3
    replicas: int = 3
    gpu_kv_tokens: int = 50_000  # per emulated worker
    sessions: int = 40
    turns: int = 4
    rate: float = 2.0  # sessions per second (Poisson)
    output_len: int = 16
    task_words: int = 600
    result_words: int = 200
    restart_sessions: int = 60
    kill_after_s: float = 8.0  # restart phase: when the replica is killed
    check_inter_ms: int = 500  # HAProxy health check interval (fall 2, rise 2)
    seed: int = 1
    sync: bool = True  # the replicas publish their in-flight counts to each other


# the test's: a few sessions, and a restart while 8 more run
SMOKE = replace(Setup(), workers=2, replicas=2, sessions=6, turns=3, rate=4.0, task_words=200,
                result_words=60, restart_sessions=8, kill_after_s=1.0)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Req:
    session: int
    turn: int
    start: float  # seconds since the phase's start
    ok: bool
    ttft_s: float = 0.0
    worker: str = ""
    reason: str = ""
    error: str = ""
    retry: bool = False


@dataclass
class Phase:
    name: str
    reqs: list[Req] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    wall_s: float = 0.0
    per_replica: dict[str, int] = field(default_factory=dict)  # HAProxy: connections per server
    events: dict[str, float] = field(default_factory=dict)  # restart: kill, down, ready, up

    def oks(self) -> list[Req]:
        return [r for r in self.reqs if r.ok]

    def followups(self) -> list[tuple[Req, Req]]:
        """(previous turn, follow-up) pairs of answered requests."""
        by = {(r.session, r.turn): r for r in self.oks()}
        return [(by[(s, t - 1)], r) for (s, t), r in by.items() if t and (s, t - 1) in by]

    def summary(self) -> dict[str, Any]:
        pairs = self.followups()
        ttft = sorted(r.ttft_s for r in self.oks())
        n = max(1, len(pairs))
        return {
            "requests": len(self.reqs),
            "answered": len(self.oks()),
            "failed": sum(not r.ok for r in self.reqs),
            "failed_after_retry": sum(not r.ok and r.retry for r in self.reqs),
            "cached_share": self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
            "followups": len(pairs),
            "sticky_share": sum(f.reason in STICKY for _, f in pairs) / n,
            "same_worker_share": sum(p.worker == f.worker for p, f in pairs) / n,
            "followup_reasons": dict(Counter(f.reason for _, f in pairs)),
            "ttft_p50_ms": 1000 * _pct(ttft, 0.5),
            "ttft_p90_ms": 1000 * _pct(ttft, 0.9),
            "wall_s": self.wall_s,
            "per_replica": self.per_replica,
            "events": self.events,
        }


def _pct(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


# --- processes ----------------------------------------------------------------------------------


def haproxy_binary() -> str:
    exe = shutil.which("haproxy")
    if exe is None:
        raise SystemExit(HAPROXY_HINT)
    return exe


def _get(url: str, timeout: float = 5) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def _post(url: str, timeout: float = 90) -> int:
    req = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return int(r.status)


class Proc:
    """A child process in its own session (killed with its children), logging to a file."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.argv, self.log = argv, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, start_new_session=True, stdout=out,
                                         stderr=subprocess.STDOUT)  # fmt: skip

    def kill(self, sig: int = signal.SIGTERM) -> None:
        p = self.proc
        if p is None or p.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, sig)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()

    def wait_ready(self, url: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while _get(url, timeout=2)[0] != 200:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.argv[:3]} exited with {self.proc.returncode}; "
                                   f"see {self.log}")  # fmt: skip
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} not ready in {timeout_s:.0f} s; see {self.log}")
            time.sleep(0.2)


def router(
    spec: ClusterSpec, stack: Stack, port: int, log: Path, extra: tuple[str, ...] = ()
) -> Proc:
    r = replace(spec.router, host="127.0.0.1", port=port, policy="smetric")
    r = replace(r, extra_args=(*r.extra_args, *extra))
    return Proc([sys.executable, "-m", *router_args(replace(spec, router=r), stack.workers)], log)


def sync_flags(replicas: int) -> list[tuple[str, ...]]:
    """Each replica's --replica-sync-bind and the same peer list for all."""
    ends = [f"tcp://127.0.0.1:{free_port()}" for _ in range(replicas)]
    return [("--replica-sync-bind", e, "--replica-sync-peers", *ends) for e in ends]


def haproxy_config(port: int, stats_port: int, replicas: list[int], inter_ms: int) -> str:
    servers = "\n".join(f"    server r{i} 127.0.0.1:{p} check" for i, p in enumerate(replicas))
    return f"""global
    maxconn 4096
defaults
    mode tcp
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    retries 3
    option redispatch
frontend routers_in
    bind 127.0.0.1:{port}
    default_backend routers
backend routers
    balance roundrobin
    option httpchk GET /readiness
    http-check expect status 200
    default-server inter {inter_ms}ms fall 2 rise 2
{servers}
listen stats
    mode http
    bind 127.0.0.1:{stats_port}
    stats enable
    stats uri /stats
"""


def haproxy_servers(stats_url: str) -> dict[str, dict[str, str]]:
    """The backend's servers as HAProxy's stats CSV has them (status, stot, ...)."""
    status, body = _get(f"{stats_url}/stats;csv", timeout=2)
    if status != 200:
        return {}
    text = body.decode().lstrip("# ")
    rows = csv.DictReader(io.StringIO(text))
    skip = ("FRONTEND", "BACKEND")
    return {r["svname"]: r for r in rows if r["pxname"] == "routers" and r["svname"] not in skip}


# --- load ---------------------------------------------------------------------------------------


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_VOCAB) for _ in range(n))


async def _one(http: aiohttp.ClientSession, url: str, body: dict[str, Any],
               ) -> tuple[float, str, str, str]:  # fmt: skip
    """(ttft_s, worker, reason, reply text) of one streamed chat completion."""
    t0 = time.monotonic()
    ttft, text, done = 0.0, [], False
    async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}")
        worker = resp.headers.get("x-smetric-worker", "")
        reason = resp.headers.get("x-smetric-reason", "")
        async for raw in resp.content:
            line = raw.strip()
            done = done or line == b"data: [DONE]"
            if not line.startswith(b"data:") or done:
                continue
            if not ttft:
                ttft = time.monotonic() - t0
            for c in json.loads(line[5:]).get("choices") or []:
                text.append((c.get("delta") or {}).get("content") or "")
    if not done:  # a connection cut mid-stream can end the body without a transport error
        raise RuntimeError("stream ended before [DONE]")
    return ttft, worker, reason, "".join(text)


async def session(http: aiohttp.ClientSession, url: str, model: str, setup: Setup, sid: int,
                  t_start: float, delay: float, out: list[Req]) -> None:  # fmt: skip
    await asyncio.sleep(delay)
    rng = random.Random(setup.seed * 100_000 + sid)
    messages: list[dict[str, str]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"Task {sid}: " + _words(rng, setup.task_words)},
    ]
    for turn in range(setup.turns):
        body = {"model": model, "messages": messages, "max_tokens": setup.output_len,
                "stream": True, "ignore_eos": True}  # fmt: skip
        for retry in (False, True):
            start = time.monotonic() - t_start
            try:
                ttft, worker, reason, text = await _one(http, url, body)
            except (aiohttp.ClientError, RuntimeError, asyncio.TimeoutError, ValueError) as e:
                out.append(Req(sid, turn, start, False, error=f"{type(e).__name__}: {e}"[:100],
                               retry=retry))  # fmt: skip
                if retry:
                    return
                await asyncio.sleep(0.2)
                continue
            out.append(Req(sid, turn, start, True, ttft, worker, reason, retry=retry))
            break
        messages.append({"role": "assistant", "content": text})
        messages.append({"role": "user", "content": "Tool result: "
                         + _words(rng, setup.result_words)})  # fmt: skip


async def drive(url: str, model: str, setup: Setup, sessions: int, t_start: float,
                ) -> list[Req]:  # fmt: skip
    rng = random.Random(setup.seed)
    at, delays = 0.0, []
    for _ in range(sessions):
        delays.append(at)
        at += rng.expovariate(setup.rate)
    out: list[Req] = []
    # a new connection per request: through the balancer, each turn may meet another replica
    conn = aiohttp.TCPConnector(force_close=True, limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as http:
        await asyncio.gather(*(session(http, url, model, setup, s, t_start, d, out)
                               for s, d in enumerate(delays)))  # fmt: skip
    return sorted(out, key=lambda r: r.start)


# --- phases -------------------------------------------------------------------------------------


def run_phase(name: str, url: str, model: str, setup: Setup, workers: list[str], sessions: int,
              stats_url: str | None = None, restart: Any = None) -> Phase:  # fmt: skip
    for w in workers:
        _post(f"{w}/flush_cache?timeout=60")
    p0, c0 = token_counters(workers)
    before = {k: int(v["stot"]) for k, v in haproxy_servers(stats_url).items()} if stats_url else {}
    phase = Phase(name)
    t0 = time.monotonic()

    async def main() -> list[Req]:
        load = asyncio.create_task(drive(url, model, setup, sessions, t0))
        if restart is not None:
            phase.events = await asyncio.to_thread(restart, t0)
        return await load

    phase.reqs = asyncio.run(main())
    phase.wall_s = time.monotonic() - t0
    p1, c1 = token_counters(workers)
    phase.prompt_tokens, phase.cached_tokens = p1 - p0, c1 - c0
    if stats_url:
        after = haproxy_servers(stats_url)
        phase.per_replica = {k: int(v["stot"]) - before.get(k, 0) for k, v in after.items()}
    return phase


@contextlib.contextmanager
def tier(spec: ClusterSpec, stack: Stack, setup: Setup, work: Path,
         ) -> Iterator[tuple[str, str, list[Proc], list[int]]]:  # fmt: skip
    """Replicas on free ports behind HAProxy: (balancer URL, stats URL, replicas, their ports)."""
    exe = haproxy_binary()
    ports = [free_port() for _ in range(setup.replicas)]
    sync = sync_flags(setup.replicas) if setup.sync else [()] * setup.replicas
    reps = [router(spec, stack, p, work / f"replica{i}.log", sync[i]) for i, p in enumerate(ports)]
    lb_port, stats_port = free_port(), free_port()
    cfg = work / "haproxy.cfg"
    cfg.write_text(haproxy_config(lb_port, stats_port, ports, setup.check_inter_ms))
    lb = Proc([exe, "-db", "-f", str(cfg)], work / "haproxy.log")
    try:
        for r in reps:
            r.start()
        for r, p in zip(reps, ports, strict=True):
            r.wait_ready(f"http://127.0.0.1:{p}/readiness")
        lb.start()
        stats = f"http://127.0.0.1:{stats_port}"
        deadline = time.monotonic() + 30
        while [s.get("status") for s in haproxy_servers(stats).values()] != ["UP"] * len(ports):
            if time.monotonic() > deadline:
                raise RuntimeError(f"HAProxy did not see every replica UP; see {work}")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{lb_port}", stats, reps, ports
    finally:
        lb.kill()
        for r in reps:
            r.kill()


def restarter(rep: Proc, port: int, stats: str, kill_after_s: float) -> Any:
    """The restart experiment's timeline (seconds since the phase's start), run in a thread."""

    def run(t0: float) -> dict[str, float]:
        time.sleep(max(0.0, t0 + kill_after_s - time.monotonic()))
        ev: dict[str, float] = {}
        # the cost is in the requests it holds: kill it while it serves one (at most 5 s later)
        until = time.monotonic() + 5
        while time.monotonic() < until:
            ev["in_flight"] = float(haproxy_servers(stats).get("r0", {}).get("scur") or 0)
            if ev["in_flight"]:
                break
            time.sleep(0.02)
        rep.kill(signal.SIGKILL)
        ev["killed"] = time.monotonic() - t0
        rep.start()  # at once on its port, as a kubelet restarts the container
        deadline = time.monotonic() + 120
        while "up" not in ev and time.monotonic() < deadline:
            status = haproxy_servers(stats).get("r0", {}).get("status", "")
            now = time.monotonic() - t0
            if "down" not in ev and status.startswith("DOWN"):
                ev["down"] = now
            if "ready" not in ev and _get(f"http://127.0.0.1:{port}/readiness", 1)[0] == 200:
                ev["ready"] = now
            if "down" in ev and status == "UP":
                ev["up"] = now
            # back before HAProxy's checks failed twice: it never saw the replica down
            if "ready" in ev and "down" not in ev and status == "UP" and now - ev["ready"] > 2:
                break
            time.sleep(0.05)
        return ev

    return run


def run_all(setup: Setup, work: Path, log: Any = print) -> dict[str, Phase]:
    spec = ClusterSpec(workers=WorkerSpec(count=setup.workers,
                                          extra_args=("--gpu-kv-tokens",
                                                      str(setup.gpu_kv_tokens))))  # fmt: skip
    model = spec.workers.model_name
    haproxy_binary()  # before anything starts
    stack = Stack(spec)
    phases: dict[str, Phase] = {}
    try:
        stack.start_workers()
        workers = stack.worker_urls
        log(f"workers: {' '.join(workers)}")
        port = free_port()
        one = router(spec, stack, port, work / "one.log")
        one.start()
        try:
            one.wait_ready(f"http://127.0.0.1:{port}/readiness")
            phases["one"] = run_phase("one", f"http://127.0.0.1:{port}", model, setup, workers,
                                      setup.sessions)  # fmt: skip
        finally:
            one.kill()
        log(f"one: {phases['one'].summary()}")
        with tier(spec, stack, setup, work) as (url, stats, reps, ports):
            phases["tier"] = run_phase("tier", url, model, setup, workers, setup.sessions, stats)
            log(f"tier: {phases['tier'].summary()}")
            if setup.restart_sessions:
                r = restarter(reps[0], ports[0], stats, setup.kill_after_s)
                phases["restart"] = run_phase("restart", url, model, setup, workers,
                                              setup.restart_sessions, stats, r)  # fmt: skip
                log(f"restart: {phases['restart'].summary()}")
    finally:
        stack.stop()
    return phases


# --- report -------------------------------------------------------------------------------------


def report(setup: Setup, phases: dict[str, Phase], out: Path, png: Path | None) -> str:
    s = {k: p.summary() for k, p in phases.items()}
    rows = [("one", "1 router"), ("tier", f"{setup.replicas} replicas behind HAProxy")]
    lines = [
        "# The router tier: replicas behind HAProxy versus one router"
        + ("" if setup.sync else ", replicas not synced"),
        "",
        "`python -m benchmarks.router_tier` (benchmarks/router_tier.py). One run on a shared "
        "2-core machine; times are modelled (emulated H20 workers, Qwen3-Coder-30B-A3B profile, "
        "in real time) plus this machine's Python overheads, not GPU measurements.",
        "",
        f"Setup: {setup.workers} emulated workers; {setup.sessions} agent sessions of "
        f"{setup.turns} turns (a shared system prompt, a {setup.task_words}-word task, then "
        f"{setup.result_words}-word tool results; {setup.output_len} output tokens, streamed), "
        f"Poisson arrivals at {setup.rate:g} sessions/s, worker caches flushed before each phase. "
        f"Tier: {setup.replicas} separate router processes (`--policy smetric`, "
        + (
            "publishing their in-flight counts to each other with `--replica-sync-bind` and "
            "`--replica-sync-peers`) "
            if setup.sync
            else "`--no-replica-sync`: nothing shared but the workers) "
        )
        + "behind HAProxy in TCP mode, `balance roundrobin`, `option httpchk GET /readiness` every "
        f"{setup.check_inter_ms} ms (fall 2, rise 2); the client opens a new connection per "
        "request, so consecutive turns of a session meet different replicas.",
        "",
        "| routers | requests | failed | cached share | sticky follow-ups | follow-ups on "
        "previous worker | TTFT p50 (ms) | TTFT p90 (ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, label in rows:
        if key in s:
            x = s[key]
            lines.append(
                f"| {label} | {x['requests']} | {x['failed']} | {x['cached_share']:.1%} | "
                f"{x['sticky_share']:.1%} | {x['same_worker_share']:.1%} | "
                f"{x['ttft_p50_ms']:.0f} | {x['ttft_p90_ms']:.0f} |"
            )
    reasons = "; ".join(f"{label}: " + ", ".join(f"{k} {v}" for k, v in
                                                 sorted(s[key]["followup_reasons"].items()))
                        for key, label in rows if key in s)  # fmt: skip
    lines += ["", f"Follow-ups by the router's decision (x-smetric-reason): {reasons}."]
    if "tier" in s:
        per = ", ".join(f"{k}: {v}" for k, v in sorted(s["tier"]["per_replica"].items()))
        lines += ["", f"Connections per replica (HAProxy's counters) in the tier run: {per}."]
    if "restart" in s:
        x, ev = s["restart"], s["restart"]["events"]

        def since(k: str) -> str:
            return f"{ev[k] - ev['killed']:.2f} s" if k in ev and "killed" in ev else "not seen"

        lines += [
            "",
            "## A replica's restart",
            "",
            f"{setup.restart_sessions} sessions through the tier; replica r0 killed with SIGKILL "
            f"{ev.get('killed', 0):.1f} s in, the first moment after {setup.kill_after_s:g} s that "
            f"it held a connection ({ev.get('in_flight', 0):.0f} then, HAProxy's `scur`), and "
            "started again at once on its port (as a kubelet restarts a crashed container). A "
            "client retries a failed request once after 0.2 s.",
            "",
            f"- requests: {x['requests']} ({x['answered']} answered); failed attempts: "
            f"{x['failed']}, of which still failing on their retry: {x['failed_after_retry']}",
            f"- HAProxy marked r0 DOWN {since('down')} after the kill; the new process answered "
            f"/readiness {since('ready')} after it; HAProxy put it back UP {since('up')} after it",
            f"- sticky follow-ups {x['sticky_share']:.1%}, on previous worker "
            f"{x['same_worker_share']:.1%}, cached share {x['cached_share']:.1%}, TTFT p50/p90 "
            f"{x['ttft_p50_ms']:.0f}/{x['ttft_p90_ms']:.0f} ms",
        ]
        errors = sorted({r.error for r in phases["restart"].reqs if not r.ok})
        if errors:
            lines.append("- errors seen: " + "; ".join(f"`{e}`" for e in errors))
    if png is not None:
        lines += ["", f"![TTFT and the restart timeline]({png.name})"]
    lines += ["", "```json", json.dumps({"setup": asdict(setup), "phases": s}, indent=1), "```", ""]
    text = "\n".join(lines)
    out.write_text(text)
    return text


def plot(phases: dict[str, Phase], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    for key, p in phases.items():
        xs = sorted(1000 * r.ttft_s for r in p.oks())
        if xs:
            ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=key)
    ax.set_xlabel("TTFT (ms)")
    ax.set_ylabel("share of requests")
    ax.set_title("TTFT CDF")
    ax.legend()
    ax = axes[1]
    if "restart" in phases:
        p = phases["restart"]
        ok = [r.start for r in p.reqs if r.ok]
        bad = [r.start for r in p.reqs if not r.ok]
        top = max([r.start for r in p.reqs], default=1.0)
        bins = [i * 0.5 for i in range(int(top / 0.5) + 2)]
        ax.hist([ok, bad], bins=bins, stacked=True, label=["answered", "failed"],
                color=["tab:blue", "tab:red"])  # fmt: skip
        for k, v in p.events.items():
            if k == "in_flight":
                continue
            ax.axvline(v, linestyle="--", color="gray")
            ax.text(v, ax.get_ylim()[1] * 0.9, k, rotation=90, va="top")
        ax.set_xlabel("request start (s)")
        ax.set_ylabel("requests per 0.5 s")
        ax.set_title("restart: one replica killed and started again")
        ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Phase]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="the smallest run (the test's)")
    p.add_argument("--replicas", type=int, help="router replicas behind HAProxy")
    p.add_argument("--sessions", type=int, help="sessions per phase")
    p.add_argument("--rate", type=float, help="sessions per second")
    p.add_argument("--restart-sessions", type=int, help="sessions of the restart phase (0: none)")
    p.add_argument("--kill-after", type=float, dest="kill_after_s",
                   help="restart phase: seconds before the replica is killed")  # fmt: skip
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--work-dir", type=Path, help="logs and HAProxy's config (default: a temp dir)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument(
        "--no-replica-sync",
        action="store_true",
        help="replicas share nothing but the workers (written as router_tier-nosync)",
    )
    a = p.parse_args(argv)
    setup = SMOKE if a.smoke else Setup()
    setup = replace(setup, sync=not a.no_replica_sync)
    for k in ("replicas", "sessions", "rate", "restart_sessions", "kill_after_s"):
        if getattr(a, k) is not None:
            setup = replace(setup, **{k: getattr(a, k)})
    haproxy_binary()
    work = a.work_dir or Path(tempfile.mkdtemp(prefix="router-tier-"))
    work.mkdir(parents=True, exist_ok=True)
    phases = run_all(setup, work)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    name = ("router_tier-smoke" if a.smoke else "router_tier") + ("" if setup.sync else "-nosync")
    png = None if a.no_plot else a.out_dir / f"{name}.png"
    if png is not None:
        plot(phases, png)
    report(setup, phases, a.out_dir / f"{name}.md", png)
    print(f"wrote {a.out_dir / (name + '.md')} (logs in {work})")
    return phases


if __name__ == "__main__":
    main()
