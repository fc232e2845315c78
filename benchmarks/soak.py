"""Soak: many mixed requests through the router while workers are killed and restarted.

    python -m benchmarks.soak                      # 200K requests, a worker killed every 30 s
    python -m benchmarks.soak --requests 20000 --out /tmp/soak --kill-every-s 0

Starts `--workers` emulated SGLang workers (KV events on, fixed ports) and the router, then
drives `--requests` requests at `--concurrency`: chat (streaming and not, single requests and
multi-turn sessions so the KV index and the in-flight view are exercised), `/generate` and
`/v1/completions` (streaming and not), and a few malformed bodies. Every `--kill-every-s`
seconds one worker (in turn) gets SIGKILL and is started again on the same ports.

Each answer is classified: `ok` (a complete answer: JSON with choices/text, or a stream ending in
`data: [DONE]`), `clean failure` (an HTTP error with a JSON error body, or a stream that ends with
an SSE error event and [DONE]) or `unclean` (a reset, a timeout, a truncated stream, a body that
does not parse). The router's RSS (and the workers') is sampled every `--sample-every` requests.
At the end the router's `smetric_worker_inflight` gauges must return to 0.

Writes OUT.md (verdict and numbers), OUT.json (the samples) and OUT_rss.png (logs go to a
temporary directory, printed at the start); `python -m benchmarks.soak plot-runs OUT.png
LABEL=RUN.json ...` overlays earlier runs' router RSS. Exit status 1 if a check failed: an
unclean answer, in-flight not back to 0, or router RSS growth after warm-up at or above
`--max-growth`. Loopback only. Where the router's memory goes: `--router-python-args
benchmarks/soak_probe.py` (malloc totals, the KV feeds' state, tracemalloc; see that file).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from smetric_router.core.prometheus import samples, total
from smetric_router.launch.ports import free_ports

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "qwen3-coder-30b-a3b-emulated"
HOST = "127.0.0.1"
_VOCABULARY = """file test build error import class def return value list dict parse read write
open close fix patch diff commit branch merge run tool call result pass fail assert check line
column module package config option flag path token cache page index worker"""
WORDS = tuple(_VOCABULARY.split())
SYSTEM_PROMPTS = [
    f"You are coding agent #{i}. Read files, run tools and edit code until the task is done. " * 6
    for i in range(4)
]


@dataclass(frozen=True, slots=True)
class Config:
    requests: int
    concurrency: int
    workers: int
    kill_every_s: float
    sample_every: int
    warmup_fraction: float
    max_growth: float
    speedup: float
    sessions: int
    turns: int
    kv_events: bool
    seed: int
    out: Path
    router_python_args: tuple[str, ...]
    router_env: tuple[tuple[str, str], ...]
    router_args: tuple[str, ...]
    kill_every_requests: int = 0  # > 0: kill by progress instead of on the clock

    @property
    def kills(self) -> bool:
        return self.kill_every_s > 0 or self.kill_every_requests > 0


@dataclass(frozen=True, slots=True)
class Sample:
    requests: int
    t_s: float
    router_rss_mb: float
    workers_rss_mb: float


@dataclass
class Tally:
    outcomes: Counter[str] = field(default_factory=Counter)  # kind/outcome -> count
    unclean_examples: list[str] = field(default_factory=list)
    done: int = 0
    kills: int = 0
    restarts: int = 0

    def add(self, kind: str, outcome: str, why: str = "") -> None:
        self.outcomes[f"{kind}/{outcome}"] += 1
        self.done += 1
        if outcome == "unclean" and len(self.unclean_examples) < 20:
            self.unclean_examples.append(f"{kind}: {why}"[:300])

    def total(self, outcome: str) -> int:
        return sum(n for k, n in self.outcomes.items() if k.endswith("/" + outcome))


# -- processes -------------------------------------------------------------------------------


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0.0


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready in {timeout_s} s")


class Worker:
    """One emulated worker on fixed ports, so a restart comes back where the router expects it."""

    def __init__(self, i: int, ports: list[int], speedup: float, logdir: Path) -> None:
        self.port, self.kv_port, self.replay_port = ports
        self.url = f"http://{HOST}:{self.port}"
        self.argv = [
            sys.executable,
            "-m",
            "smetric_router.emulator",
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--kv-events-port",
            str(self.kv_port),
            "--kv-events-replay-port",
            str(self.replay_port),
            "--model-name",
            MODEL,
            "--speedup",
            str(speedup),
            "--log-level",
            "warning",
        ]
        self.log = logdir / f"worker{i}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait_ready(self) -> None:
        assert self.proc is not None
        _wait_http(self.url + "/health", self.proc)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


def start_router(cfg: Config, port: int, urls: list[str], logdir: Path) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable,
        *cfg.router_python_args,
        "-m",
        "smetric_router",
        "--host",
        HOST,
        "--port",
        str(port),
        "--policy",
        "smetric",
        "--log-level",
        "warning",
        "--health-check-interval-secs",
        "1",
        "--worker-urls",
        *urls,
        *cfg.router_args,
    ]
    if not cfg.kv_events:
        argv.append("--no-kv-events")
    env = {**os.environ, **dict(cfg.router_env)}
    with (logdir / "router.log").open("ab") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    _wait_http(f"http://{HOST}:{port}/readiness", proc)
    return proc


# -- requests --------------------------------------------------------------------------------


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)) + f" #{rng.getrandbits(32):08x}"


@dataclass
class Session:
    messages: list[dict[str, str]]
    turns: int = 0


class Mix:
    """The request mix; sessions are taken one request at a time (a session's turns are serial)."""

    def __init__(self, cfg: Config, rng: random.Random) -> None:
        self.cfg = cfg
        self.rng = rng
        self.free = [self._new_session() for _ in range(cfg.sessions)]

    def _new_session(self) -> Session:
        rng = self.rng
        return Session(
            [
                {"role": "system", "content": rng.choice(SYSTEM_PROMPTS)},
                {"role": "user", "content": "Task: " + _text(rng, 60)},
            ]
        )

    def pick(self) -> tuple[str, str, dict[str, Any] | bytes, Session | None]:
        """(kind, path, body, session); kind says the endpoint and streaming."""
        rng = self.rng
        r = rng.random()
        tokens = rng.randint(4, 16)
        if r < 0.40 and self.free:
            s = self.free.pop(rng.randrange(len(self.free)))
            stream = rng.random() < 0.4
            body = {
                "model": MODEL,
                "messages": list(s.messages),
                "max_tokens": tokens,
                "stream": stream,
            }
            return ("session-stream" if stream else "session"), "/v1/chat/completions", body, s
        if r < 0.60:
            stream = rng.random() < 0.5
            body = {
                "model": MODEL,
                "stream": stream,
                "max_tokens": tokens,
                "messages": [
                    {"role": "system", "content": rng.choice(SYSTEM_PROMPTS)},
                    {"role": "user", "content": _text(rng, 80)},
                ],
            }
            return ("chat-stream" if stream else "chat"), "/v1/chat/completions", body, None
        if r < 0.78:
            stream = rng.random() < 0.5
            body = {
                "text": rng.choice(SYSTEM_PROMPTS) + _text(rng, 120),
                "stream": stream,
                "sampling_params": {"max_new_tokens": tokens},
            }
            return ("generate-stream" if stream else "generate"), "/generate", body, None
        if r < 0.98:
            stream = rng.random() < 0.5
            body = {
                "model": MODEL,
                "prompt": _text(rng, 100),
                "max_tokens": tokens,
                "stream": stream,
            }
            kind = "completions-stream" if stream else "completions"
            return kind, "/v1/completions", body, None
        # malformed: must be refused cleanly (4xx with an OpenAI-shaped error)
        return "malformed", "/v1/chat/completions", b'{"model": "x", "messages": [', None

    def finish(self, s: Session, reply: str | None) -> None:
        if reply is not None:
            s.turns += 1
            s.messages += [
                {"role": "assistant", "content": reply},
                {"role": "user", "content": "Tool: " + _text(self.rng, 40)},
            ]
        if s.turns >= self.cfg.turns:
            s = self._new_session()
        self.free.append(s)


def _stream_outcome(raw: bytes, kind: str) -> tuple[str, str | None, str]:
    """(outcome, reply text, why) of a whole SSE body."""
    events = [e for e in raw.split(b"\n\n") if e.strip()]
    if not events or events[-1].strip() != b"data: [DONE]":
        return "unclean", None, f"stream without [DONE] ({len(raw)} B): {raw[-200:]!r}"
    text: list[str] = []
    for e in events[:-1]:
        if not e.startswith(b"data: "):
            return "unclean", None, f"not an SSE data event: {e[:200]!r}"
        try:
            obj = json.loads(e[6:])
        except ValueError:
            return "unclean", None, f"event does not parse: {e[:200]!r}"
        if "error" in obj:
            return "failed_clean", None, ""
        if kind.startswith("session"):
            for c in obj.get("choices") or []:
                text.append((c.get("delta") or {}).get("content") or "")
    return "ok", "".join(text), ""


def _json_outcome(status: int, raw: bytes, kind: str) -> tuple[str, str | None, str]:
    try:
        obj = json.loads(raw)
    except ValueError:
        return "unclean", None, f"HTTP {status}, body does not parse: {raw[:200]!r}"
    if status >= 400:
        err = obj.get("error") if isinstance(obj, dict) else None
        if isinstance(err, dict) and "message" in err:
            return "failed_clean", None, ""
        return "unclean", None, f"HTTP {status}, not an OpenAI error body: {raw[:200]!r}"
    if kind == "generate" and isinstance(obj, dict) and "text" in obj:
        return "ok", None, ""
    if isinstance(obj, dict) and obj.get("choices"):
        msg = obj["choices"][0].get("message") or {}
        return "ok", msg.get("content"), ""
    return "unclean", None, f"HTTP {status}, no answer in body: {raw[:200]!r}"


async def one_request(http: aiohttp.ClientSession, base: str, mix: Mix, tally: Tally) -> None:
    kind, path, body, session = mix.pick()
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    reply: str | None = None
    try:
        async with http.post(
            base + path, data=data, headers={"content-type": "application/json"}
        ) as resp:
            raw = await resp.read()
            if resp.status == 200 and kind.endswith("stream"):
                outcome, reply, why = _stream_outcome(raw, kind)
            else:
                outcome, reply, why = _json_outcome(resp.status, raw, kind)
            if kind == "malformed" and outcome == "ok":
                outcome, why = "unclean", "a malformed body was answered 200"
            if outcome == "failed_clean":
                kind = f"{kind}[{resp.status}]"
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        outcome, why = "unclean", f"{type(e).__name__}: {e}"
    finally:
        if session is not None:
            mix.finish(session, reply if outcome == "ok" else None)
    tally.add(kind, outcome, why)


async def inflight_total(http: aiohttp.ClientSession, base: str) -> float:
    async with http.get(base + "/metrics") as resp:
        text = await resp.text()
    return total(samples(text), "smetric_worker_inflight")


# -- the run ---------------------------------------------------------------------------------


async def drive(
    cfg: Config,
    base: str,
    router: subprocess.Popen[bytes],
    workers: list[Worker],
    tally: Tally,
    samples: list[Sample],
) -> float:
    """Run the requests; returns the in-flight total once it settled (or at the deadline)."""
    rng = random.Random(cfg.seed)
    mix = Mix(cfg, rng)
    t0 = time.monotonic()
    issued = 0

    def sample() -> None:
        wrss = sum(rss_mb(w.proc.pid) for w in workers if w.proc is not None)
        samples.append(
            Sample(
                tally.done,
                round(time.monotonic() - t0, 1),
                round(rss_mb(router.pid), 1),
                round(wrss, 1),
            )
        )
        s = samples[-1]
        print(
            f"{s.requests:>7} req  {s.t_s:>7.0f} s  router {s.router_rss_mb:6.1f} MB  "
            f"workers {s.workers_rss_mb:6.1f} MB  unclean {tally.total('unclean')}  "
            f"failed {tally.total('failed_clean')}  kills {tally.kills}",
            flush=True,
        )

    kill_due = asyncio.Event()
    next_kill = cfg.kill_every_requests

    async def client(http: aiohttp.ClientSession) -> None:
        nonlocal issued, next_kill
        while issued < cfg.requests:
            issued += 1
            await one_request(http, base, mix, tally)
            if cfg.kill_every_requests and tally.done >= next_kill:
                next_kill += cfg.kill_every_requests
                kill_due.set()
            if tally.done % cfg.sample_every == 0:
                sample()

    async def killer() -> None:
        i = 0
        loop = asyncio.get_running_loop()
        while True:
            if cfg.kill_every_requests:
                # by progress, not the clock: a loaded machine still kills inside the run
                await kill_due.wait()
                kill_due.clear()
            else:
                # a fixed cadence: a slow restart does not stretch the interval
                await asyncio.sleep(t0 + (i + 1) * cfg.kill_every_s - time.monotonic())
            w = workers[i % len(workers)]
            i += 1
            await loop.run_in_executor(None, w.kill)
            tally.kills += 1
            await loop.run_in_executor(None, w.start)
            await loop.run_in_executor(None, w.wait_ready)
            tally.restarts += 1

    timeout = aiohttp.ClientTimeout(total=120)
    conn = aiohttp.TCPConnector(limit=cfg.concurrency)
    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as http:
        sample()
        kill_task = asyncio.create_task(killer()) if cfg.kills else None
        await asyncio.gather(*(client(http) for _ in range(cfg.concurrency)))
        if kill_task is not None:
            kill_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await kill_task
        deadline = time.monotonic() + 30
        while (left := await inflight_total(http, base)) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        if samples[-1].requests != tally.done:
            sample()
        return left


def growth(samples: list[Sample], warmup: int) -> tuple[Sample, float, float]:
    """(baseline sample, growth at the end, peak growth) of router RSS after warm-up."""
    after = [s for s in samples if s.requests >= warmup]
    base = after[0]
    end = (after[-1].router_rss_mb - base.router_rss_mb) / base.router_rss_mb
    peak = (max(s.router_rss_mb for s in after) - base.router_rss_mb) / base.router_rss_mb
    return base, end, peak


def trend(samples: list[Sample], warmup: int) -> tuple[float, float, float]:
    """After warm-up: least-squares slope of router RSS (MB per 100K requests), and the peak RSS
    of the first and of the second half of the samples. A leak shows as a slope and a higher
    second peak; allocator and working-set fluctuation as neither."""
    after = [s for s in samples if s.requests >= warmup]
    xs = [float(s.requests) for s in after]
    ys = [s.router_rss_mb for s in after]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    half = max(1, len(ys) // 2)
    return slope * 1e5, max(ys[:half]), max(ys[half:] or ys[-1:])


def plot(samples: list[Sample], warmup: int, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = [s.requests / 1000 for s in samples]
    ax.plot(xs, [s.router_rss_mb for s in samples], label="router RSS")
    ax.plot(xs, [s.workers_rss_mb for s in samples], label="workers' RSS (sum)", alpha=0.6)
    ax.axvline(warmup / 1000, color="grey", linestyle=":", label="end of warm-up")
    ax.set_xlabel("requests answered (thousands)")
    ax.set_ylabel("MB")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def report(
    cfg: Config, tally: Tally, samples: list[Sample], inflight_left: float, wall_s: float
) -> tuple[str, bool]:
    warmup = int(cfg.requests * cfg.warmup_fraction)
    base, end, peak = growth(samples, warmup)
    unclean = tally.total("unclean")
    checks = {
        "every request answered or cleanly failed (0 unclean)": unclean == 0,
        "router in-flight back to 0": inflight_left == 0,
        f"router RSS growth after warm-up < {cfg.max_growth:.0%}": end < cfg.max_growth,
    }
    first, last = samples[0], samples[-1]
    lines = [
        f"- requests: {tally.done} at concurrency {cfg.concurrency}, {cfg.workers} emulated "
        f"workers (speedup {cfg.speedup}), KV events {'on' if cfg.kv_events else 'off'}; "
        f"wall time {wall_s:.0f} s ({tally.done / wall_s:.0f} req/s)",
        f"- worker kills (SIGKILL) and restarts: {tally.kills} / {tally.restarts} "
        + (
            f"(every {cfg.kill_every_requests} requests)"
            if cfg.kill_every_requests
            else f"(every {cfg.kill_every_s:g} s)"
        )
        if cfg.kills
        else "- no worker kills",
        f"- ok: {tally.total('ok')}, failed cleanly: {tally.total('failed_clean')}, "
        f"unclean: {unclean}",
        f"- router in-flight after the run: {inflight_left:g}",
        f"- router RSS: {first.router_rss_mb:.1f} MB at start, {base.router_rss_mb:.1f} MB after "
        f"warm-up ({base.requests} requests), {last.router_rss_mb:.1f} MB at the end "
        f"({end:+.1%}; peak after warm-up {peak:+.1%})",
        "- router RSS trend after warm-up: {:+.1f} MB per 100K requests (least squares); peak "
        "{:.1f} MB in the first half of the samples, {:.1f} MB in the second".format(
            *trend(samples, warmup)
        ),
        "",
        "| check | result |",
        "|---|---|",
        *(f"| {name} | {'PASS' if ok else 'FAIL'} |" for name, ok in checks.items()),
        "",
        "| kind/outcome | count |",
        "|---|---|",
        *(f"| {k} | {n} |" for k, n in sorted(tally.outcomes.items())),
    ]
    if tally.unclean_examples:
        lines += ["", "Unclean answers (first 20):", *(f"- `{u}`" for u in tally.unclean_examples)]
    return "\n".join(lines), all(checks.values())


def run(cfg: Config) -> bool:
    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    logdir = Path(tempfile.mkdtemp(prefix="soak-logs-"))
    print(f"processes' logs: {logdir}", flush=True)
    ports = free_ports(3 * cfg.workers + 1)
    workers = [Worker(i, ports[3 * i : 3 * i + 3], cfg.speedup, logdir) for i in range(cfg.workers)]
    router: subprocess.Popen[bytes] | None = None
    tally = Tally()
    samples: list[Sample] = []
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.wait_ready()
        router = start_router(cfg, ports[-1], [w.url for w in workers], logdir)
        t0 = time.monotonic()
        left = asyncio.run(
            drive(cfg, f"http://{HOST}:{ports[-1]}", router, workers, tally, samples)
        )
        wall = time.monotonic() - t0
    finally:
        if router is not None and router.poll() is None:
            os.killpg(router.pid, signal.SIGINT)
            try:
                router.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(router.pid, signal.SIGKILL)
        for w in workers:
            w.stop()
    text, ok = report(cfg, tally, samples, left, wall)
    print(text)
    title = f"router RSS over {tally.done} requests, KV events {'on' if cfg.kv_events else 'off'}"
    plot(samples, int(cfg.requests * cfg.warmup_fraction), Path(f"{cfg.out}_rss.png"), title)
    Path(f"{cfg.out}.json").write_text(
        json.dumps(
            {
                "config": {k: str(v) for k, v in asdict(cfg).items()},
                "wall_s": wall,
                "outcomes": dict(tally.outcomes),
                "inflight_left": left,
                "kills": tally.kills,
                "restarts": tally.restarts,
                "samples": [asdict(s) for s in samples],
            },
            indent=1,
        )
    )
    Path(f"{cfg.out}.md").write_text(text + "\n")
    return ok


def parse(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.soak",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--requests", type=int, default=200_000, help="requests in all")
    p.add_argument("--concurrency", type=int, default=32, help="requests in flight at once")
    p.add_argument("--workers", type=int, default=4, help="emulated workers")
    p.add_argument(
        "--kill-every-s",
        type=float,
        default=30.0,
        help="SIGKILL a worker (in turn) this often, then restart it; 0 = never",
    )
    p.add_argument(
        "--kill-every-requests",
        type=int,
        default=0,
        help="instead of --kill-every-s: kill a worker each time this many more requests are done",
    )
    p.add_argument("--sample-every", type=int, default=2000, help="RSS sample every N requests")
    p.add_argument(
        "--warmup-fraction",
        type=float,
        default=0.1,
        help="RSS growth is measured from this share of the requests on",
    )
    p.add_argument(
        "--max-growth",
        type=float,
        default=0.10,
        help="router RSS growth after warm-up that fails the run",
    )
    p.add_argument("--speedup", type=float, default=50.0, help="emulated workers' speed-up")
    p.add_argument("--sessions", type=int, default=64, help="multi-turn chat sessions kept open")
    p.add_argument("--turns", type=int, default=8, help="turns before a session starts over")
    p.add_argument(
        "--no-kv-events",
        action="store_true",
        help="run the router with --no-kv-events (for comparison)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--out", type=Path, default=RESULTS / "soak", help="writes OUT.md, OUT.json and OUT_rss.png"
    )
    p.add_argument(
        "--router-python-args",
        default="",
        help="words between python and '-m smetric_router', e.g. a native heap "
        "profile: '-m memray run --native -o /tmp/router.bin'",
    )
    p.add_argument(
        "--router-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment for the router, e.g. MALLOC_ARENA_MAX=2 (repeatable)",
    )
    p.add_argument(
        "--router-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an extra router argument (repeatable; use --router-arg=--flag)",
    )
    a = p.parse_args(argv)
    return Config(
        requests=a.requests,
        concurrency=a.concurrency,
        workers=a.workers,
        kill_every_s=a.kill_every_s,
        kill_every_requests=a.kill_every_requests,
        sample_every=a.sample_every,
        warmup_fraction=a.warmup_fraction,
        max_growth=a.max_growth,
        speedup=a.speedup,
        sessions=a.sessions,
        turns=a.turns,
        kv_events=not a.no_kv_events,
        seed=a.seed,
        out=a.out,
        router_python_args=tuple(shlex.split(a.router_python_args)),
        router_env=tuple((k, v) for k, _, v in (kv.partition("=") for kv in a.router_env)),
        router_args=tuple(a.router_arg),
    )


def plot_runs(runs: list[tuple[str, Path]], path: Path) -> None:
    """Overlay the router RSS of earlier runs (their OUT.json), e.g. before and after a fix."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, src in runs:
        samples = json.loads(src.read_text())["samples"]
        ax.plot(
            [s["requests"] / 1000 for s in samples],
            [s["router_rss_mb"] for s in samples],
            marker=".",
            label=label,
        )
    ax.set_xlabel("requests answered (thousands)")
    ax.set_ylabel("router RSS (MB)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["plot-runs"]:
        # plot-runs OUT.png LABEL=RUN.json ...: no run, only the overlay of earlier runs
        pairs = [a.split("=", 1) for a in args[2:]]
        plot_runs([(label, Path(src)) for label, src in pairs], Path(args[1]))
        return 0
    return 0 if run(parse(args)) else 1


if __name__ == "__main__":
    sys.exit(main())
