"""Admission control under overload: smetric-router with admission on and off, and smg 1.13 with
its queue and rate limit, over the same emulated cluster, driven by agent sessions of several
tenants (one of them bursts of sub-agents) at multiples of the cluster's measured capacity.

    python -m benchmarks.admission            # 3 workers, loads 1, 1.5, 2, 3 x capacity,
                                              # isolation and a 10K flood (~31 min, printed)
    python -m benchmarks.admission --quick    # 2 workers, 2 x capacity, a 2K flood (< 2 min)
    python -m benchmarks.admission --loads 2 --contenders smetric+admission,smetric

Steps, all on one set of emulated workers (started once, caches flushed before every run):

1. Capacity: `workers × --max-running` agents run sessions back to back through smetric-router
   without admission for `--calibration-s`: every batch slot busy, nothing queued in the
   workers. The completed-request rate over the session's turns is the capacity, in sessions/s.
2. Load sweep: per load L and contender, Poisson session arrivals at L × capacity for
   `--window-s`, split evenly between the tenants, then `--drain-s` for running sessions to end.
3. Isolation: the first tenant at its share alone, then with the burst tenant at 10× its share.
4. Flood: `--flood` streamed requests at once into smetric-router with admission on, clients
   leaving while they wait; router RSS before, at the peak and after, then one more request.

The admission settings are derived from the cluster and the calibration (printed and in the
report). Emulated workers model an H20's timing at `--speedup` model seconds per wall second;
the report gives model time. Writes benchmarks/results/admission.md (or --out) + three PNGs;
the records of every run stay under --work-dir.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import shlex
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from benchmarks.admission_flood import FloodResult, flood
from benchmarks.admission_load import Records, Run, Shape, Tenant, plan_sessions
from benchmarks.admission_report import OFF, ON, SMG, Context, dump, write
from benchmarks.admission_stats import RunStats, capacity_of, stats
from benchmarks.compare import PortTaken, RouterDef, def_argv, flush, running
from smetric_router.launch import ClusterSpec, Stack, WorkerSpec, free_port
from smetric_router.launch.kinds.sglang import sglang_python

RESULTS = Path(__file__).resolve().parent / "results"
CONTENDERS = (ON, OFF, SMG)
STARTUP_S = 4.0  # a router's start and stop, per run, for the time estimate


@dataclass(frozen=True, slots=True)
class Setup:
    workers: int = 3
    # SGLang's --max-running-requests per worker: the batch the cluster runs at once, so that
    # the modelled engine, not this machine's CPUs, is what runs out
    max_running: int = 4
    gpu_kv_tokens: int = 200_000
    speedup: float = 0.5  # model seconds per wall second: keeps request rates within 2 cores
    shape: Shape = field(default_factory=Shape)
    loads: tuple[float, ...] = (1.0, 1.5, 2.0, 3.0)
    window_s: float = 60.0  # wall seconds of session arrivals per run
    drain_s: float = 30.0  # wall seconds after the arrivals before the run is cut
    calibration_s: float = 30.0
    slo_ttft_s: float = 0.5  # model seconds
    tenants: tuple[str, ...] = ("alpha", "beta", "swarm")
    burst_tenant: str = "swarm"
    burst: int = 8  # sub-agents per launch of the burst tenant
    isolation: bool = True
    isolation_factor: float = 10.0
    isolation_window_s: float = 45.0
    flood: int = 10_000
    flood_hold_s: float = 10.0
    capacity: float = 0.0  # sessions per wall second; 0: calibrate
    contenders: tuple[str, ...] = CONTENDERS
    seed: int = 1
    label: str = "full"  # quick: the smoke size, said so in the report

    def runs(self) -> int:
        return len(self.loads) * len(self.contenders)

    def estimate_s(self) -> float:
        """Wall seconds the whole benchmark should take (workers' start included)."""
        t = 10.0 + (0 if self.capacity else self.calibration_s + STARTUP_S)
        t += self.runs() * (self.window_s + self.drain_s + STARTUP_S)
        if self.isolation:
            t += 2 * len(self.contenders) * (self.isolation_window_s + self.drain_s + STARTUP_S)
        if self.flood:
            # each round: the requests reaching the queue (SYN retries past the listen
            # backlog), the clients leaving, the router settling
            t += STARTUP_S + 2 + 2 * (self.flood_hold_s + 3 + self.flood / 250)
        return t


QUICK = replace(Setup(), workers=2, loads=(2.0,), window_s=10.0, drain_s=6.0, calibration_s=6.0,
                isolation=False, flood=2000, flood_hold_s=4.0,
                shape=replace(Shape(), turns=3), label="quick")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Settings:
    """The admission flags derived from the cluster and the calibration."""

    max_concurrent: int
    queue_size: int
    queue_timeout_s: float  # wall
    ceiling_s: float  # wall
    smg_rate: int  # requests per wall second


def derive(setup: Setup, req_s: float, mean_request_s: float) -> Settings:
    """The cap: every batch slot, plus one waiting per worker so a freed slot refills without a
    round trip. The timeout: twice the TTFT SLO, so a follow-up that waits behind the others
    still gets its turn (its session's history is cached and the agent is mid-task) while a
    new session that cannot start soon is told to come back. The queue: what the cap admits
    within one timeout at the calibrated request time; more would only time out. The first-turn
    ceiling: the timeout, so new sessions never go before running sessions' follow-ups."""
    slots = setup.workers * setup.max_running
    cap = slots + setup.workers
    timeout = 2 * setup.slo_ttft_s / setup.speedup
    per = mean_request_s if mean_request_s > 0 and not math.isnan(mean_request_s) else timeout
    queue = max(cap, math.ceil(cap * timeout / per))
    return Settings(cap, queue, timeout, timeout, max(1, math.ceil(req_s)))


def admission_flags(s: Settings) -> tuple[str, ...]:
    return ("--max-concurrent-requests", str(s.max_concurrent), "--queue-size", str(s.queue_size),
            "--queue-timeout-secs", f"{s.queue_timeout_s:g}")  # fmt: skip


def contender_def(name: str, s: Settings, key_file: Path) -> RouterDef:
    if name == ON:
        extra = (*admission_flags(s), "--queue-first-turn-ceiling-secs", f"{s.ceiling_s:g}",
                 "--api-key-file", str(key_file))  # fmt: skip
        return RouterDef("smetric", "smetric", extra)
    if name == OFF:
        return RouterDef("smetric", "smetric")
    if name == SMG:
        # smg's timeout is whole seconds; its rate limit is requests per second
        extra = ("--max-concurrent-requests", str(s.max_concurrent), "--queue-size",
                 str(s.queue_size), "--queue-timeout-secs", str(math.ceil(s.queue_timeout_s)),
                 "--rate-limit-tokens-per-second", str(s.smg_rate))  # fmt: skip
        return RouterDef("smg", "cache_aware", extra)
    raise SystemExit(f"unknown contender {name!r}; known: {', '.join(CONTENDERS)}")


def tenant_keys(setup: Setup) -> list[Tenant]:
    return [Tenant(t, f"sk-bench-{t}-{setup.seed}") for t in setup.tenants]


def write_key_file(tenants: Sequence[Tenant], path: Path) -> Path:
    # keys inline: the file is the benchmark's own, under its work dir
    doc = {"tenants": [{"name": t.name, "key": t.key, "weight": t.weight} for t in tenants]}
    path.write_text(json.dumps(doc, indent=2))
    return path


class Cluster:
    """The emulated workers and how to put a router in front of them."""

    def __init__(self, setup: Setup, work: Path) -> None:
        extra = ("--gpu-kv-tokens", str(setup.gpu_kv_tokens), "--max-running-requests",
                 str(setup.max_running))  # fmt: skip
        self.spec = ClusterSpec(workers=WorkerSpec(count=setup.workers, speedup=setup.speedup,
                                                   extra_args=extra))  # fmt: skip
        self.stack = Stack(self.spec)
        self.work = work
        self.model = self.spec.workers.model_name
        self.sglang_py = sglang_python(self.spec.sglang)

    @property
    def workers(self) -> list[str]:
        return self.stack.worker_urls

    @contextlib.contextmanager
    def router(self, d: RouterDef, slug: str, key: str, tries: int = 3
               ) -> Iterator[tuple[str, int]]:  # fmt: skip
        """(URL, pid) of router d on a free port, ready; another port if one was taken."""
        for attempt in range(tries):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            argv = def_argv(d, self.spec, self.workers, port, self.sglang_py, self.stack)
            log = self.work / f"{slug}.router.log"
            try:
                with running(argv, url, self.model, log,
                             headers={"Authorization": f"Bearer {key}"}) as proc:  # fmt: skip
                    yield url, proc.pid
                    return
            except PortTaken:
                if attempt == tries - 1:
                    raise


def calibrate(setup: Setup, cluster: Cluster, tenant: Tenant,
              log: Callable[[str], None]) -> tuple[float, float, float]:  # fmt: skip
    slots = setup.workers * setup.max_running
    with cluster.router(RouterDef("smetric", "smetric"), "calibration", tenant.key) as (url, _):
        flush(cluster.workers)
        client = Run(url, cluster.model, [tenant], setup.shape, setup.seed)
        rec = asyncio.run(client.closed_loop(tenant.name, slots, setup.calibration_s))
    cap = capacity_of(rec, setup.calibration_s, setup.shape.turns)
    log(f"calibration: {slots} agents back to back: {cap[1]:.2f} req/s, {cap[0]:.3f} sessions/s "
        f"(wall), mean request {cap[2]:.2f} s wall")  # fmt: skip
    return cap


def one_run(setup: Setup, cluster: Cluster, name: str, d: RouterDef, tenants: Sequence[Tenant],
            rates: dict[str, float], window_s: float, load: float,
            slug: str) -> tuple[RunStats, Records]:  # fmt: skip
    plans = plan_sessions(rates, {setup.burst_tenant: setup.burst}, window_s, setup.seed)
    stop = window_s + setup.drain_s
    with cluster.router(d, slug, tenants[0].key) as (url, _):
        flush(cluster.workers)
        client = Run(url, cluster.model, tenants, setup.shape, setup.seed)
        rec = asyncio.run(client.play(plans, stop))
    (cluster.work / f"{slug}.records.json").write_text(json.dumps(
        {"attempts": [asdict(a) for a in rec.attempts],
         "sessions": [asdict(s) for s in rec.sessions]}))  # fmt: skip
    return stats(name, load, rec, stop, setup.speedup, setup.slo_ttft_s), rec


def summary_line(r: RunStats) -> str:
    return (f"{r.router:18s} load {r.load:g}: goodput {r.goodput:.2f} req/s (model), "
            f"{r.in_slo}/{r.ok} in SLO, sessions {r.completed}/{r.sessions} completed, "
            f"{r.abandoned} abandoned, refused {r.shed} ({r.shed_429_with_retry_after} 429 with "
            f"Retry-After), "
            f"lost {r.lost}, TTFT p90 first {r.first_ttft_p90_s:.3f} s follow-up "
            f"{r.follow_ttft_p90_s:.3f} s")  # fmt: skip


@dataclass
class Outcome:
    runs: list[RunStats]
    isolation: list[RunStats]
    flood: FloodResult | None
    context: Context
    report: Path


def run(setup: Setup, argv: Sequence[str], out: Path, work: Path,
        log: Callable[[str], None] = print) -> Outcome:  # fmt: skip
    t0 = time.monotonic()
    work.mkdir(parents=True, exist_ok=True)
    tenants = tenant_keys(setup)
    key_file = write_key_file(tenants, work / "tenants.json")
    cluster = Cluster(setup, work)
    runs: list[RunStats] = []
    iso: list[RunStats] = []
    fl: FloodResult | None = None
    try:
        cluster.stack.start_workers()
        log(f"workers: {' '.join(cluster.workers)}")
        if setup.capacity:
            turns = setup.shape.turns
            cap_s, req_s, mean = setup.capacity, setup.capacity * turns, float("nan")
        else:
            cap_s, req_s, mean = calibrate(setup, cluster, tenants[0], log)
        settings = derive(setup, req_s, mean)
        log(f"admission settings: {settings}")
        share = cap_s / len(tenants)
        for load in setup.loads:
            for name in setup.contenders:
                d = contender_def(name, settings, key_file)
                rates = {t.name: load * share for t in tenants}
                slug = f"{name.replace('+', '_')}_{load:g}"
                r, _ = one_run(setup, cluster, name, d, tenants, rates, setup.window_s, load, slug)
                runs.append(r)
                log(summary_line(r))
        if setup.isolation:
            victim, burst = tenants[0], next(t for t in tenants if t.name == setup.burst_tenant)
            for name in setup.contenders:
                d = contender_def(name, settings, key_file)
                for factor in (0.0, setup.isolation_factor):
                    rates = {victim.name: share, burst.name: factor * share}
                    slug = f"iso_{name.replace('+', '_')}_{factor:g}"
                    r, _ = one_run(setup, cluster, name, d, [victim, burst], rates,
                                   setup.isolation_window_s, factor, slug)  # fmt: skip
                    iso.append(r)
                    log("isolation " + summary_line(r))
        if setup.flood:
            fl = run_flood(setup, cluster, settings, key_file, tenants[0])
            log(f"flood: {fl}")
    finally:
        cluster.stack.stop()
    ctx = context(setup, argv, time.monotonic() - t0, cluster, cap_s, req_s, mean, settings,
                  key_file)  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    write(runs, iso, fl, ctx, out)
    (work / "summary.json").write_text(json.dumps(dump(runs, iso, fl, ctx), default=str))
    log(f"wrote {out}")
    return Outcome(runs, iso, fl, ctx, out)


def run_flood(setup: Setup, cluster: Cluster, s: Settings, key_file: Path,
              tenant: Tenant) -> FloodResult:  # fmt: skip
    # the same cap, a queue that holds the whole flood and a timeout it outlasts: every request
    # waits until its client leaves
    flooded = replace(s, queue_size=setup.flood + 100, queue_timeout_s=setup.flood_hold_s + 30)
    d = contender_def(ON, flooded, key_file)
    with cluster.router(d, "flood", tenant.key) as (url, pid):
        warm = Run(url, cluster.model, [tenant], setup.shape, setup.seed)
        asyncio.run(warm.closed_loop(tenant.name, 2, 2.0))
        return asyncio.run(flood(url, pid, cluster.model, tenant.key, setup.flood,
                                 setup.flood_hold_s, seed=setup.seed))  # fmt: skip


def context(setup: Setup, argv: Sequence[str], elapsed: float, cluster: Cluster, cap_s: float,
            req_s: float, mean: float, s: Settings, key_file: Path) -> Context:  # fmt: skip
    w = cluster.spec.workers
    sh = setup.shape
    slots = setup.workers * setup.max_running
    cap_line = (
        f"{cap_s:.3f} sessions/s wall ({cap_s / setup.speedup:.2f} per model s; "
        f"{req_s:.2f} requests/s wall). "
        + ("Given with `--capacity`."
           if setup.capacity else
           f"Measured: {slots} agents (workers × `--max-running-requests`, every batch slot "
           f"busy and nothing waiting in the workers) ran sessions back to back through "
           f"smetric-router without admission for {setup.calibration_s:g} s wall; the requests "
           f"completed per second over {sh.turns} turns per session.")
        + " Load L × capacity: sessions arrive (Poisson) at L × that rate, split evenly "
        "between the tenants."
    )  # fmt: skip
    tenant_list = ", ".join(setup.tenants)
    workload = (
        f"tenants {tenant_list} (API keys in an `--api-key-file`, weight 1 each); "
        f"`{setup.burst_tenant}` arrives as launches of {setup.burst} sub-agent sessions at "
        f"once (sharing their parent's task), the others one session at a time. A session: "
        f"{sh.turns} turns of streamed chat completions (`ignore_eos`, {sh.max_tokens} output "
        f"tokens), the first ~{sh.task_words} words of task after a shared system prompt, each "
        f"follow-up adding the reply and ~{sh.tool_words} words of tool result, sent when the "
        f"previous reply has ended. Own aiohttp client. A 429 is retried after its "
        f"Retry-After (1 s when absent), at most {sh.max_retries} times per turn; then the "
        f"session is abandoned. Any other failure ends the session as failed (a lost request). "
        f"{setup.window_s:g} s wall of arrivals then {setup.drain_s:g} s of drain per run."
    )  # fmt: skip
    settings = {
        ON: "`" + " ".join(admission_flags(s)) + f" --queue-first-turn-ceiling-secs "
        f"{s.ceiling_s:g} --api-key-file tenants.json` (policy smetric). Cap: the {slots} batch "
        f"slots + 1 per worker; timeout: twice the TTFT SLO in wall s; queue: what the cap admits "
        f"within one timeout at the calibrated request time; ceiling: the timeout (new sessions "
        f"never go before follow-ups); a refusal's Retry-After from the queue's pace "
        f"(docs/admission.md#errors). No "
        f"tenant rate limits: their buckets hold a minute's allowance, longer than a run.",
        OFF: "no admission flags, no key file (policy smetric).",
        SMG: f"smg 1.13 `launch --policy cache_aware --max-concurrent-requests "
        f"{s.max_concurrent} --queue-size {s.queue_size} --queue-timeout-secs "
        f"{math.ceil(s.queue_timeout_s)} --rate-limit-tokens-per-second {s.smg_rate}` (the rate: "
        "the calibrated requests/s). Its per-tenant limiter (`--tenant-rate-limit-enabled`) "
        "is not used.",
    }
    return Context(
        command="python -m benchmarks.admission " + shlex.join(argv),
        elapsed_s=elapsed,
        cluster=f"{w.count} emulated workers (profile {w.profile}, speedup {w.speedup:g}, "
        f"`{' '.join(w.extra_args)}`)",
        capacity_sessions_s=cap_s, capacity_req_s=req_s, mean_request_s=mean,
        capacity_line=cap_line,
        settings={k: v for k, v in settings.items() if k in setup.contenders},
        workload=workload, slo_ttft_s=setup.slo_ttft_s, speedup=setup.speedup,
        tenants=setup.tenants, burst_tenant=setup.burst_tenant, quick=setup.label == "quick",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    d = Setup()
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.admission", description=__doc__.split("\n\n")[0],
    )  # fmt: skip
    p.add_argument("--quick", action="store_true",
                   help="smoke size: 2 workers, 3-turn sessions, one load (2x), 10 s runs, no "
                   "isolation, a 2000-request flood (< 2 min)")  # fmt: skip
    p.add_argument("--workers", type=int, help=f"emulated workers (default {d.workers})")
    p.add_argument(
        "--max-running",
        type=int,
        help=f"each worker's --max-running-requests (default {d.max_running})",
    )
    p.add_argument(
        "--speedup",
        type=float,
        help=f"workers' model seconds per wall second (default {d.speedup:g})",
    )
    p.add_argument("--loads", help="comma-separated offered loads, times capacity; empty: no "
                   "load sweep (default 1,1.5,2,3)")  # fmt: skip
    p.add_argument(
        "--contenders", help=f"comma-separated subset of {', '.join(CONTENDERS)} (default all)"
    )
    p.add_argument(
        "--window-s",
        type=float,
        help=f"wall seconds of session arrivals per run (default {d.window_s:g})",
    )
    p.add_argument("--drain-s", type=float, help="wall seconds after the arrivals before the "
                   f"run is cut (default {d.drain_s:g})")  # fmt: skip
    p.add_argument(
        "--calibration-s",
        type=float,
        help=f"wall seconds of the capacity calibration (default {d.calibration_s:g})",
    )
    p.add_argument(
        "--capacity", type=float, help="skip the calibration: capacity in sessions per wall second"
    )
    p.add_argument(
        "--slo-ttft-ms", type=float, help=f"TTFT SLO in model ms (default {d.slo_ttft_s * 1000:g})"
    )
    p.add_argument("--turns", type=int, help=f"turns per session (default {d.shape.turns})")
    p.add_argument(
        "--burst", type=int, help=f"sub-agents per launch of the burst tenant (default {d.burst})"
    )
    p.add_argument("--max-retries", type=int, help="refusals (429/503) a turn may get before "
                   f"its session is abandoned (default {d.shape.max_retries})")  # fmt: skip
    p.add_argument("--no-isolation", action="store_true", help="skip the isolation runs")
    p.add_argument("--isolation", action="store_true", help="run them even with --quick")
    p.add_argument(
        "--isolation-window-s",
        type=float,
        help=f"wall seconds of arrivals per isolation run (default {d.isolation_window_s:g})",
    )
    p.add_argument(
        "--flood-hold-s",
        type=float,
        help=f"longest a flood client waits before it leaves (default {d.flood_hold_s:g})",
    )
    p.add_argument(
        "--flood",
        type=int,
        help=f"requests per round (two rounds) of the flood check, 0 to skip (default {d.flood})",
    )
    p.add_argument("--seed", type=int, help=f"arrivals and prompts (default {d.seed})")
    p.add_argument("--out", type=Path, help="report path, the PNGs beside it (default "
                   "benchmarks/results/admission.md; admission-quick.md with --quick)")  # fmt: skip
    p.add_argument(
        "--work-dir",
        type=Path,
        default=Path("/tmp/smetric-admission"),
        help="router logs, per-run records, summary.json (default /tmp/smetric-admission)",
    )
    return p


def setup_from(a: argparse.Namespace) -> Setup:
    s = QUICK if a.quick else Setup()
    if a.loads is not None:
        s = replace(s, loads=tuple(float(x) for x in a.loads.split(",") if x.strip()))
    if a.contenders:
        names = tuple(x.strip() for x in a.contenders.split(",") if x.strip())
        for n in names:
            if n not in CONTENDERS:
                raise SystemExit(f"unknown contender {n!r}; known: {', '.join(CONTENDERS)}")
        s = replace(s, contenders=names)
    for key in ("workers", "max_running", "speedup", "window_s", "drain_s", "calibration_s",
                "capacity", "burst", "flood", "seed", "isolation_window_s",
                "flood_hold_s"):  # fmt: skip
        if getattr(a, key) is not None:
            s = replace(s, **{key: getattr(a, key)})
    if a.slo_ttft_ms is not None:
        s = replace(s, slo_ttft_s=a.slo_ttft_ms / 1000)
    if a.turns is not None:
        s = replace(s, shape=replace(s.shape, turns=a.turns))
    if a.max_retries is not None:
        s = replace(s, shape=replace(s.shape, max_retries=a.max_retries))
    if a.no_isolation or a.isolation:
        s = replace(s, isolation=a.isolation)
    return s


def main(argv: Sequence[str] | None = None) -> Outcome:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    setup = setup_from(a)
    est = setup.estimate_s()
    print(f"estimated wall time: {est / 60:.1f} min ({setup.runs()} load runs"
          f"{', isolation' if setup.isolation else ''}"
          f"{f', a {setup.flood}-request flood' if setup.flood else ''})", flush=True)  # fmt: skip
    out = a.out or RESULTS / ("admission-quick.md" if a.quick else "admission.md")
    return run(setup, argv, out, a.work_dir / setup.label, log=lambda s: print(s, flush=True))


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through run()'s finally: the workers stop too


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    main()
