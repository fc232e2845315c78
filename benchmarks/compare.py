"""smetric-router against SGLang's own gateways on one cluster, driven by SGLang's bench_serving.

    python -m benchmarks.compare            # 4 emulated workers, all routers, 6 rates (~25 min)
    python -m benchmarks.compare --quick    # 3 workers, 16 conversations, 2 rates (< 10 min)
    python -m benchmarks.compare --config launch/emulated.yaml --routers smetric,smg/cache_aware
    python -m benchmarks.compare --trace ../shared/traces/mooncake-conversation.jsonl --tag mc
    python -m benchmarks.compare --config launch/sglang-cpu.yaml --agent --tag sglang-agent
    python -m benchmarks.compare --dataset mooncake --rounds 3 --tag mooncake-rounds
    python -m benchmarks.compare --config launch/emulated-pd-mooncake.yaml --tag pd   # PD

One cluster (the launcher's workers, emulated by default, any `--config` cluster spec, PD
included: every router then fronts the prefill and the decode instances), no router from the
launcher. For each router under test and each rate: start the router on a free loopback
port in front of the same workers, flush every worker's cache (POST /flush_cache), and run
`python -m sglang.benchmark.serving` from the CPU SGLang env (.venv-sglang, `make sglang`) with
`--backend sglang-oai-chat --dataset-name agentic-trace`: multi-turn conversations converted from a
project trace (`smetric_router.traces.to_agentic`; by default a generated agentic trace) replayed
round by round, the server's reply fed back into the next round. `--request-rate` is the arrival
rate of conversations (Poisson). `--goodput` under the TTFT/TPOT SLO, `--cache-report`,
`--output-details`, one JSONL per run. Offline: HF_HUB_OFFLINE=1, the bundled tokenizer.

`--dataset mooncake`: bench_serving's own Mooncake replay of a Mooncake trace (default the shared
conversation trace) instead: `--backend sglang` (text prompts to /generate, its only backend for
that dataset), `--conversations` sessions of `--rounds` rounds at the trace's timestamps, the
slowdown factor set so that sessions arrive at the swept rate.

`--agent`: the shape coding agents send. Every request carries tool definitions
(`--extra-request-body`) and follow-ups read as tool output; because bench_serving's multi-turn
replay keeps only role and content of each message (and smg refuses a `role: tool` message without
`tool_call_id`), each router also serves a few sessions of `smetric_router.loadgen.sessions
--tools` (assistant `tool_calls`, tool results), whose follow-ups should find their previous prompt
cached where they land. Use it with real SGLang workers (`--config launch/sglang-cpu.yaml`): they
render with the model's template, so a router whose prompt is not the worker's loses its hits there.

Per run it also reads the workers' /metrics (prompt and cached token counters: the cached share of
prompt tokens whatever the router forwards) and, for smetric-router, the router's decision counter
(stickiness = sticky follow-ups / follow-ups); from bench_serving's per-request records, the TTFT
of first turns and of follow-ups apart. Writes benchmarks/results/compare[-TAG].md, the
goodput-vs-rate and TTFT-CDF PNGs beside it, and keeps the runs' JSONL under --work-dir.

Emulated workers model an H20's timing in real time on this machine's CPUs: the numbers are
modelled engine time plus this machine's Python overheads (router, emulator, client on shared
cores), not measurements of a GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks.process_cost import renice, tree_cpu_rss
from smetric_router.core.prometheus import Sample, readable_samples, total
from smetric_router.core.types import Reason
from smetric_router.launch import (
    ClusterSpec,
    PdSpec,
    Stack,
    WorkerLaunch,
    WorkerSpec,
    free_port,
    load_spec,
    pd_worker_args,
    router_args,
)
from smetric_router.launch.kinds.sglang import (
    CPU_SITE,
    ROOT,
    TINY_MODEL_NAME,
    sglang_python,
    tokenizer_path,
)
from smetric_router.loadgen.sessions import run_sessions
from smetric_router.policies import policy_names
from smetric_router.policies.smetric_l3move import L3_MOVE
from smetric_router.traces.generate import GenConfig, generate
from smetric_router.traces.to_agentic import DEFAULT_TOKENIZER, Options, convert_file

RESULTS = Path(__file__).resolve().parent / "results"
MOONCAKE_TRACE = ROOT.parent / "shared" / "traces" / "mooncake-conversation.jsonl"
PAGE = 16  # the workers' page size (cached prefixes are whole pages)


@dataclass(frozen=True, slots=True)
class RouterDef:
    kind: str  # smetric | smg | sglang-router
    policy: str
    extra: tuple[str, ...] = ()

    @property
    def one_process(self) -> bool:
        """Whether one process answers every /metrics scrape (with --processes, any of them
        does, so counters read before and after a run may come from different processes)."""
        return "--processes" not in self.extra


# the policies whose decisions say whether a follow-up stayed with its holder: SMetric's own
STICKY_POLICIES = tuple(p for p in policy_names() if p.startswith("smetric"))
# the reasons the smetric rule gives a follow-up (x-smetric-reason)
FOLLOW_UP_REASONS = {r.value for r in Reason} - {Reason.FIRST_TURN_BALANCE.value} | {L3_MOVE}

PRIORITY_FLAG = "--follow-up-priority"
# SGLang's flags and the emulated worker's. With the default 0 a follow-up asking 1 passes the
# requests that ask none but never preempts them: SGLang would for a gap over its threshold (10),
# and a request without a priority is otherwise the lowest there is
PRIORITY_SCHEDULING = ("--enable-priority-scheduling", "--default-priority-value", "0")


def _capped(cap: int, grace_s: float = 0) -> tuple[str, ...]:
    flags = ("--max-concurrent-requests", str(cap))
    return flags + (("--queue-session-grace-secs", f"{grace_s:g}") if grace_s else ())


ROUTERS: dict[str, RouterDef] = {
    "smetric": RouterDef("smetric", "smetric"),
    **{f"smetric/{p}": RouterDef("smetric", p) for p in STICKY_POLICIES if p != "smetric"},
    "smetric/bailian": RouterDef("smetric", "bailian"),
    "smetric/lmetric": RouterDef("smetric", "lmetric"),
    "smetric/lmetric-inflight": RouterDef("smetric", "lmetric-inflight"),
    "smetric/load_balance": RouterDef("smetric", "load_balance"),
    "smetric/cache_aware": RouterDef("smetric", "cache_aware"),
    # the default with its overload guard at a factor of 1: a follow-up leaves its holder as soon
    # as staying costs more than the cheapest move (the default's 2 keeps it while they are close)
    "smetric-move1": RouterDef("smetric", "smetric", ("--move-cost-ratio", "1")),
    # the default asking the workers to take follow-ups before new sessions in their queues
    # (with it in a run, every run's workers get --enable-priority-scheduling)
    "smetric-prio1": RouterDef("smetric", "smetric", (PRIORITY_FLAG, "1")),
    # the default behind the router's admission cap of 4 requests in flight per worker (a worker
    # of --gpu-kv-tokens 50000 holds about 4 sessions' KV): 16 for compare-knee's 4 workers, 32
    # for 8 (48: 6 a worker of 8, above it); and the same keeping the slot a request frees for
    # the follow-up that continues it (docs/admission.md, "Slots kept for a session's next turn")
    **{f"smetric-cap{n}": RouterDef("smetric", "smetric", _capped(n)) for n in (16, 32, 48)},
    **{
        f"smetric-slots{n}": RouterDef("smetric", "smetric", _capped(n, grace_s=1))
        for n in (16, 32, 48)
    },
    # four router processes on one port, the kernel spreading connections between them, as four
    # replicas behind an L4 load balancer; they publish their in-flight counts to each other
    "smetric-x4": RouterDef("smetric", "smetric", ("--processes", "4")),
    # the same sharing nothing but the workers: the others' requests seen in the load reports only
    "smetric-x4-nosync": RouterDef("smetric", "smetric", ("--processes", "4", "--no-replica-sync")),
    # unsynced, with the load reports of the earlier default, one a second
    "smetric-x4-poll1": RouterDef(
        "smetric",
        "smetric",
        ("--processes", "4", "--no-replica-sync", "--load-poll-interval-secs", "1"),
    ),
    # smetric-l3move given 100 ms for the master's answer instead of 25: it waits only for the
    # follow-ups the answer could move, and on a loaded machine half its lookups took longer
    "smetric-l3move-wait100": RouterDef("smetric", "smetric-l3move", ("--l3-budget-secs", "0.1")),
    # smetric-l3move reading the tier from the workers' L3 KV events (what they announce writing
    # to the store) instead of asking the master: no lookup to wait for or to time out
    "smetric-l3move-events": RouterDef("smetric", "smetric-l3move", ("--l3-view", "events")),
    "smg/cache_aware": RouterDef("smg", "cache_aware"),
    "smg/cache_aware+sticky": RouterDef("smg", "cache_aware", ("--sticky-sessions",)),
    "smg/least_load": RouterDef("smg", "least_load"),
    "sglang-router/cache_aware": RouterDef("sglang-router", "cache_aware"),
}


@dataclass(frozen=True, slots=True)
class Setup:
    workers: int = 4
    gpu_kv_tokens: int = 50_000  # per emulated worker: ~6 first prompts; placement matters
    sessions: int = 200  # root sessions of the generated trace
    seed: int = 1
    conversations: int = 32
    max_turns: int = 8
    min_turns: int = 2  # single-request conversations say nothing about follow-ups
    tokens_per_block: int = 4  # of the trace's 16: prompts scaled to 1/4 (~8K-token first turns)
    max_prompt_tokens: int = 20_000
    output_len: int = 32
    rates: tuple[float, ...] = (2.0, 4.0, 6.0, 9.0, 12.0, 16.0)  # conversations per second
    speedup: float = 1.0  # emulated workers: model seconds per wall second
    slo_ttft_ms: float = 2000.0
    slo_tpot_ms: float = 100.0
    routers: tuple[str, ...] = tuple(ROUTERS)
    agent: bool = False  # tool results, tool definitions, and a tool-call session check
    dataset: str = "agentic-trace"  # or "mooncake": bench_serving's own Mooncake-trace replay
    rounds: int = 3  # mooncake: --mooncake-num-rounds
    tool_sessions: int = 8  # --agent: loadgen sessions (4 turns) per router
    # Arrival draws per (router, rate): bench_serving --seed 1..draws, each router meeting the
    # same draws, run draw by draw so that the machine's drift spreads over every router.
    draws: int = 1
    # The workers' (and the Mooncake master's) nice value: > 0 lets each router, like the load
    # client, have the CPU when it needs it, as a router on its own cores would, where the
    # workers would otherwise take an equal share each and a costlier router queue behind them.
    workers_nice: int = 0


QUICK = replace(Setup(), workers=3, sessions=100, conversations=16, max_turns=5, rates=(1.0, 3.0))
# the test's: one router of each kind, a few conversations
SMOKE = replace(QUICK, workers=2, sessions=20, conversations=4, max_turns=3, rates=(2.0,),
                routers=("smetric", "smg/cache_aware", "sglang-router/cache_aware"))  # fmt: skip


@dataclass
class Run:
    router: str
    rate: float
    result: dict[str, Any]
    prompt_tokens: int = 0  # workers' counters over the run
    cached_tokens: int = 0
    decisions: dict[str, float] = field(default_factory=dict)  # smetric: reason -> count
    command: str = ""
    turns: tuple[int, ...] = ()  # the conversations' lengths, in the dataset's (= replay) order
    tool_calls: dict[str, Any] = field(default_factory=dict)  # --agent: the loadgen check
    draw: int = 1  # bench_serving's --seed
    router_cpu_s: float | None = None  # the router's process tree while bench_serving ran
    decide_ms: float | None = None  # smetric-router: mean arrival-to-decision time over the run
    decide_stages_ms: dict[str, float] = field(default_factory=dict)  # decide_ms by stage
    l3_lookups: dict[str, float] = field(default_factory=dict)  # global-tier lookups by outcome

    def __post_init__(self) -> None:
        d = ROUTERS.get(self.router)
        if d is not None and not d.one_process:
            # the scrapes around the run may have reached different processes
            self.decide_ms, self.decide_stages_ms, self.l3_lookups = None, {}, {}

    @property
    def router_cpu_ms(self) -> float | None:
        """The router's CPU time (user+system, all its processes) per completed request."""
        done = self.result.get("completed", 0)
        return None if self.router_cpu_s is None or not done else 1e3 * self.router_cpu_s / done

    @property
    def cached_share(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def stickiness(self) -> float | None:
        # only the smetric rule's follow-up reasons: under PD the decode side's decisions are
        # counted too, under its policy's name
        follow = sum(v for k, v in self.decisions.items() if k in FOLLOW_UP_REASONS)
        d = ROUTERS[self.router]
        if not self.decisions or d.policy not in STICKY_POLICIES or not d.one_process or not follow:
            return None
        sticky = self.decisions.get("sticky", 0) + self.decisions.get("sticky-l3", 0)
        return sticky / follow

    def sidecar(self) -> dict[str, Any]:
        """What the run adds to bench_serving's JSONL (kept beside it; --report-only)."""
        return {"router": self.router, "rate": self.rate,
                "worker_prompt_tokens": self.prompt_tokens,
                "worker_cached_tokens": self.cached_tokens, "decisions": self.decisions,
                "command": self.command, "turns": list(self.turns),
                "tool_calls": self.tool_calls, "draw": self.draw,
                "router_cpu_s": self.router_cpu_s, "decide_ms": self.decide_ms,
                "decide_stages_ms": self.decide_stages_ms,
                "l3_lookups": self.l3_lookups}  # fmt: skip

    def _conversations(self, per_request: Sequence[object]) -> list[range] | None:
        """Each conversation's rounds as indices into bench_serving's per-request lists (its
        outputs are the conversations' rounds in dataset order); None where there are no
        outputs or they do not add up to the conversations."""
        if not per_request or sum(self.turns) != len(per_request):
            return None
        starts = [0, *itertools.accumulate(self.turns)]
        return [range(a, b) for a, b in itertools.pairwise(starts)]

    @property
    def history_hit(self) -> float | None:
        """Share of follow-ups that found their previous prompt cached (all but its last partial
        page) where they ran, from bench_serving's per-request cached_tokens (its outputs are
        the conversations' rounds in dataset order). None where the router does not pass
        SGLang's sglext (cached_tokens_details) through."""
        lens: list[int] = self.result.get("input_lens") or []
        cached = self.result.get("cached_tokens")
        errors = self.result.get("errors") or []
        conversations = self._conversations(lens)
        if not cached or not any(cached) or conversations is None:
            return None
        hits = n = 0
        for rounds in conversations:
            for k in rounds[1:]:
                if k < len(errors) and errors[k]:
                    continue
                n += 1
                hits += cached[k] >= lens[k - 1] - PAGE
        return hits / n if n else None

    @property
    def turn_ttfts(self) -> tuple[list[float], list[float]] | None:
        """The TTFTs (s) of first turns and of follow-ups that got a reply, from bench_serving's
        per-request ttfts: a router can keep the same share in SLO by making either wait, and
        an agent meets a follow-up's wait on every tool call, a first turn's once a session.
        None where the outputs do not match the conversations."""
        ttfts: list[float | None] = self.result.get("ttfts") or []
        errors = self.result.get("errors") or []
        conversations = self._conversations(ttfts)
        if conversations is None:
            return None
        split: tuple[list[float], list[float]] = ([], [])
        for rounds in conversations:
            for k in rounds:
                t = ttfts[k]
                if t is not None and t > 0 and not (k < len(errors) and errors[k]):
                    split[k != rounds.start].append(t)
        return split

    @property
    def device_shares(self) -> tuple[float, float] | None:
        """The share of first turns' and of follow-ups' prompt tokens found in the worker's GPU
        tier, from bench_serving's per-request cached_tokens_details. The cached share counts
        what the host tier and the global tier loaded too: with a global tier that holds every
        page the cached share is the same under any placement, and what a placement changes is
        how much of it is on the device when the request runs, not fetched first. None where
        the router does not pass SGLang's sglext through."""
        lens: list[int] = self.result.get("input_lens") or []
        details = self.result.get("cached_tokens_details")
        conversations = self._conversations(lens)
        if not details or not any(details) or conversations is None:
            return None
        tokens, device = [0, 0], [0, 0]  # first turns, follow-ups
        for rounds in conversations:
            for k in rounds:
                part = k != rounds.start
                tokens[part] += lens[k]
                device[part] += (details[k] or {}).get("device", 0)
        if not tokens[0] or not tokens[1]:
            return None
        return device[0] / tokens[0], device[1] / tokens[1]


# --- processes ----------------------------------------------------------------------------------


def _get(url: str, timeout: float = 5, attempts: int = 3) -> tuple[int, bytes]:
    """GET url; a read that times out is tried again, up to `attempts` in all: on 2 cores shared
    with 8 workers and a Mooncake master a live router can miss one 5 s read, and a lost read of
    its counters would end a sweep of an hour."""
    for attempt in range(1, attempts + 1):
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except (TimeoutError, urllib.error.URLError) as e:
            timed_out = isinstance(e, TimeoutError) or isinstance(e.reason, TimeoutError)
            if not timed_out or attempt == attempts:
                raise
    raise AssertionError("unreachable")


def _post(url: str, body: dict[str, Any] | None = None, timeout: float = 30,
          headers: dict[str, str] | None = None) -> tuple[int, bytes]:  # fmt: skip
    data = json.dumps(body).encode() if body is not None else b""
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"content-type": "application/json",
                                          **(headers or {})})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def router_argv(name: str, spec: ClusterSpec, workers: list[str], port: int,
                sglang_py: str, stack: Stack) -> list[str]:  # fmt: skip
    return def_argv(ROUTERS[name], spec, workers, port, sglang_py, stack)


def def_argv(d: RouterDef, spec: ClusterSpec, workers: list[str], port: int,
             sglang_py: str, stack: Stack) -> list[str]:  # fmt: skip
    """The command line of router `d` on `port` in front of `workers`."""
    if d.kind == "smetric":
        r = replace(spec.router, host="127.0.0.1", port=port, policy=d.policy)
        own = router_args(replace(spec, router=r), stack.workers)
        return [sys.executable, "-m", *own, *d.extra]
    prom = ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
    on = peer_workers(spec.pd, stack.workers, workers)
    common = ["--host", "127.0.0.1", "--port", str(port), *on,
              "--policy", d.policy, "--log-level", "warn", *prom, *d.extra]  # fmt: skip
    if d.kind == "smg":
        # `python -m smg`: .venv-sglang/bin/smg is sglang-router's script (both wheels ship one)
        return [sglang_py, "-m", "smg", "launch", *common]
    return [sglang_py, "-m", "sglang_router.launch_router", *common]


def peer_workers(pd: PdSpec | None, launched: list[WorkerLaunch], urls: list[str]) -> list[str]:
    """The workers on a peer router's command line: `--worker-urls URL...`, or under PD
    `--pd-disaggregation` and the instances as smetric-router gets them (their `--policy` then
    serves prefill and decode alike)."""
    if pd is None:
        return ["--worker-urls", *urls]
    return ["--pd-disaggregation", *pd_worker_args(launched)]


def _chat_ok(url: str, model: str, headers: dict[str, str] | None = None) -> bool:
    body = {"model": model, "max_tokens": 2,
            "messages": [{"role": "user", "content": "ready?"}]}  # fmt: skip
    try:
        status, _ = _post(url + "/v1/chat/completions", body, timeout=5, headers=headers)
    except (urllib.error.URLError, OSError):
        return False
    return status == 200


@contextlib.contextmanager
def running(
    argv: list[str],
    url: str,
    model: str,
    log: Path,
    timeout_s: float = 90,
    headers: dict[str, str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """A router process, ready once it answers a chat completion (sent with `headers`: a key
    for a router that requires one); stopped on exit."""
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, start_new_session=True, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout_s
        while not _chat_ok(url, model, headers):
            if proc.poll() is not None:
                if re.search(rb"address already in use", log.read_bytes(), re.I):
                    raise PortTaken(f"router could not bind; see {log}")
                raise RuntimeError(f"router exited with {proc.returncode}; see {log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"router not ready in {timeout_s:.0f} s; see {log}")
            time.sleep(0.3)
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class PortTaken(RuntimeError):
    pass


@contextlib.contextmanager
def router_on_free_port(
    name: str, spec: ClusterSpec, workers: list[str], sglang_py: str, stack: Stack, model: str,
    log: Path, tries: int = 3,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:  # fmt: skip
    """The router on a free loopback port: its URL and process. Another process can take the
    port between free_port() and the router's bind (other benchmarks on this machine): then a
    new port."""
    for attempt in range(tries):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        try:
            with running(router_argv(name, spec, workers, port, sglang_py, stack), url, model,
                         log) as proc:  # fmt: skip
                yield url, proc
                return
        except PortTaken:
            if attempt == tries - 1:
                raise
            print(f"{name}: port {port} was taken before the router bound it; another port")


def flush(workers: list[str], l3: str | None = None, writers: list[str] | None = None) -> None:
    """Every worker's own tiers, and with l3 (the Mooncake master's metrics URL) the shared global
    tier too, so that no run starts with what the one before it wrote to the store. It is
    cleared through `writers` (default: every worker), the workers with a storage backend: under
    PD the prefill instances, since a decode instance has none to clear (400)."""
    for w in workers:
        status, body = _post(f"{w}/flush_cache?timeout=60", timeout=90)
        if status != 200:
            raise RuntimeError(f"{w}/flush_cache: {status} {body[:200]!r}")
    writers = workers if writers is None else writers
    if l3 is not None and writers:
        clear_l3(writers, l3)


def clear_l3(workers: list[str], master_metrics: str, timeout_s: float = 60) -> None:
    """Clear through every worker until the master counts no key: remove_all keeps each object
    for the master's lease after its last put or get (default_kv_lease_ttl, 5 s). One clear
    empties the store, but each worker announces the removal of only the pages it announced
    (its L3 KV events), and the next router replays those events from the start."""
    deadline = time.monotonic() + timeout_s
    while True:
        for worker in workers:
            status, body = _post(f"{worker}/hicache/storage-backend/clear", timeout=90)
            if status != 200:
                raise RuntimeError(
                    f"{worker}/hicache/storage-backend/clear: {status} {body[:200]!r}"
                )
        _, text = _get(f"{master_metrics}/metrics")
        keys = next((s.value for s in readable_samples(text.decode())
                     if s.name == "master_key_count"), None)  # fmt: skip
        if keys == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Mooncake store still holds {keys} keys after {timeout_s} s")
        time.sleep(1.0)


def master_metrics(spec: ClusterSpec) -> str | None:
    m = spec.mooncake
    return None if m is None else f"http://{m.host}:{m.metrics_port}"


def token_counters(workers: list[str]) -> tuple[int, int]:
    """The workers' prompt and cached token counters, summed over workers and label sets."""
    prompt = cached = 0.0
    for w in workers:
        _, text = _get(f"{w}/metrics")
        found = readable_samples(text.decode())
        prompt += total(found, "sglang:prompt_tokens_total")
        cached += total(found, "sglang:cached_tokens_total")
    return int(prompt), int(cached)


DECIDE_SUM, DECIDE_COUNT = "smetric_decision_seconds_sum", "smetric_decision_seconds_count"
STAGE_SUM = "smetric_decision_stage_seconds_sum"
STAGE = "stage:"  # key prefix of a stage's summed seconds in decisions()


def router_samples(router_url: str) -> list[Sample]:
    """One scrape of a router's /metrics, for decisions() and l3_lookups(); none for a peer
    whose port serves no metrics."""
    status, text = _get(f"{router_url}/metrics")
    return readable_samples(text.decode()) if status == 200 else []


def decisions(samples: list[Sample]) -> dict[str, float]:
    """smetric-router's decisions by reason so far, plus the sum and count of its
    arrival-to-decision times under DECIDE_SUM / DECIDE_COUNT and of each stage's part of them
    under STAGE + its name; empty for a peer."""
    out: dict[str, float] = {}
    for s in samples:
        if s.name == "smetric_decisions_total" and "reason" in s.labels:
            out[s.labels["reason"]] = out.get(s.labels["reason"], 0.0) + s.value
        elif s.name in (DECIDE_SUM, DECIDE_COUNT):
            out[s.name] = s.value
        elif s.name == STAGE_SUM and "stage" in s.labels:
            out[STAGE + s.labels["stage"]] = s.value
    return out


L3_LOOKUPS = "smetric_l3_lookups_total"


def l3_lookups(samples: list[Sample]) -> dict[str, float]:
    """smetric-router's global-tier lookups so far by outcome (hit, miss, unknown, timeout: over
    --l3-budget-secs, decided as unknown); empty for a peer or a router without --l3-view."""
    out: dict[str, float] = {}
    for s in samples:
        if s.name == L3_LOOKUPS and "outcome" in s.labels:
            out[s.labels["outcome"]] = out.get(s.labels["outcome"], 0.0) + s.value
    return out


def split_decisions(
    before: dict[str, float], after: dict[str, float]
) -> tuple[dict[str, float], float | None, dict[str, float]]:
    """The decisions by reason made between two scrapes, their mean arrival-to-decision time
    in ms (None for a router that does not report it), and its mean by stage in ms."""
    delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
    total, count = delta.pop(DECIDE_SUM, None), delta.pop(DECIDE_COUNT, None)
    stages = {k.removeprefix(STAGE): delta.pop(k) for k in list(delta) if k.startswith(STAGE)}
    if total is None or not count:
        return delta, None, {}
    return delta, 1e3 * total / count, {k: 1e3 * v / count for k, v in stages.items()}


def bench_env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(CPU_SITE), str(ROOT), os.environ.get("PYTHONPATH"))
                           if p)  # fmt: skip
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "SMETRIC_SGLANG_CPU": "1", "PYTHONPATH": path}  # fmt: skip


def bench_argv(sglang_py: str, url: str, model: str, work: Workload, setup: Setup, rate: float,
               out: Path, tokenizer: str = str(DEFAULT_TOKENIZER),
               draw: int = 1) -> list[str]:  # fmt: skip
    n = str(work.meta["conversations"])
    if setup.dataset == "mooncake":
        # bench_serving's Mooncake replay runs on the native backend only (text to /generate) and
        # schedules sessions by the trace's timestamps, ignoring --request-rate: the slowdown
        # factor turns the trace's own session rate into the swept one
        slowdown = work.meta["trace_sessions_per_s"] / rate
        data = ["--backend", "sglang", "--dataset-name", "mooncake",
                "--dataset-path", str(work.path), "--num-prompts", n,
                "--mooncake-num-rounds", str(setup.rounds),
                "--mooncake-slowdown-factor", f"{slowdown:.4g}"]  # fmt: skip
    else:
        tools = work.meta.get("tools")
        extra = ["--extra-request-body", json.dumps({"tools": tools})] if tools else []
        data = ["--backend", "sglang-oai-chat", *extra, "--dataset-name", "agentic-trace",
                "--dataset-path", str(work.path), "--num-prompts", n,
                "--sharegpt-output-len", str(setup.output_len),
                "--request-rate", f"{rate:g}"]  # fmt: skip
    return [sglang_py, "-m", "sglang.benchmark.serving", "--base-url", url, "--model", model,
            "--tokenizer", tokenizer, *data, "--seed", str(draw), "--warmup-requests", "0",
            "--ready-check-timeout-sec", "0", "--disable-tqdm",
            "--goodput", f"ttft:{setup.slo_ttft_ms:g}", f"tpot:{setup.slo_tpot_ms:g}",
            "--cache-report", "--output-details", "--output-file", str(out)]  # fmt: skip


# --- the run ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Workload:
    path: Path  # what bench_serving reads
    meta: dict[str, Any]
    turns: tuple[int, ...]  # the conversations' lengths, in replay order

    def save(self, work: Path) -> None:
        doc = {"path": str(self.path), "metadata": self.meta, "turns": list(self.turns)}
        (work / "workload.json").write_text(json.dumps(doc))

    @staticmethod
    def load(work: Path) -> Workload:
        doc = json.loads((work / "workload.json").read_text())
        return Workload(Path(doc["path"]), doc["metadata"], tuple(doc["turns"]))


def workload(setup: Setup, trace: Path | None, work: Path) -> Workload:
    if setup.dataset == "mooncake":
        return mooncake_workload(setup, trace or MOONCAKE_TRACE, work)
    if trace is None:
        trace = work / f"agentic-{setup.sessions}-s{setup.seed}.jsonl"
        if not trace.exists():
            generate(GenConfig(sessions=setup.sessions, seed=setup.seed), trace)
    opts = Options(conversations=setup.conversations, max_turns=setup.max_turns,
                   min_turns=setup.min_turns,
                   tokens_per_block=setup.tokens_per_block,
                   max_prompt_tokens=setup.max_prompt_tokens, agent=setup.agent)  # fmt: skip
    out = work / "conversations.json"
    doc = convert_file(trace, out, opts)
    return Workload(out, doc["metadata"], tuple(len(c) for c in doc["conversations"]))


# bench_serving's Mooncake text per hash id: its number and 128 x "hi" (~130 tokens)
TOKENS_PER_HASH_ID = 130


def mooncake_workload(setup: Setup, trace: Path, work: Path) -> Workload:
    """The first `conversations` records of a Mooncake trace whose last round stays within
    `max_prompt_tokens` (kept in order with their timestamps, in a file bench_serving reads),
    each a session of `rounds` rounds."""
    if not trace.exists():
        raise SystemExit(f"{trace}: no such trace (the Mooncake traces are in ../shared/traces)")
    with trace.open() as f:
        every = [json.loads(line) for line in f if line.strip()]

    def last_round(r: dict[str, Any]) -> int:  # history of rounds + placeholder replies
        base = len(r["hash_ids"]) * TOKENS_PER_HASH_ID
        return setup.rounds * base + (setup.rounds - 1) * int(r.get("output_length", 256))

    cap = setup.max_prompt_tokens
    kept = [r for r in every if not cap or last_round(r) <= cap]
    recs = kept[: setup.conversations]
    if not recs:
        raise SystemExit(f"no record of {trace} fits --max-prompt-tokens {cap}")
    out = work / "mooncake-sessions.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in recs))
    # the kept records' own session rate, over the whole file (its first records share t=0)
    span_s = (max(r["timestamp"] for r in kept) - min(r["timestamp"] for r in kept)) / 1000
    n = len(recs)
    meta = {"source": str(trace), "format": "mooncake", "conversations": n,
            "turns": n * setup.rounds, "max_turns": setup.rounds, "rounds": setup.rounds,
            "kept_share": len(kept) / len(every), "max_prompt_tokens": cap,
            "trace_sessions_per_s": len(kept) / max(span_s, 1e-3),
            "mean_hash_ids": round(sum(len(r["hash_ids"]) for r in recs) / n, 1),
            "mean_output_tokens": round(sum(r["output_length"] for r in recs) / n)}  # fmt: skip
    return Workload(out, meta, (setup.rounds,) * n)


def default_spec(setup: Setup) -> ClusterSpec:
    return ClusterSpec(workers=WorkerSpec(count=setup.workers, speedup=setup.speedup,
                                          extra_args=("--gpu-kv-tokens",
                                                      str(setup.gpu_kv_tokens))))  # fmt: skip


def run_all(setup: Setup, spec: ClusterSpec, load: Workload, work: Path,
            log: Any = print, resume: bool = False) -> list[Run]:  # fmt: skip
    sglang_py = sglang_python(spec.sglang)
    emulated = spec.workers.kind == "emulated"
    model = spec.workers.model_name if emulated else (
        spec.sglang.served_model_name or TINY_MODEL_NAME)  # fmt: skip
    # the workers' tokenizer: bench_serving counts with it, the tool-call check renders with it
    tok = str(DEFAULT_TOKENIZER) if emulated else tokenizer_path(spec.sglang)
    runs: list[Run] = []
    l3 = master_metrics(spec)
    stack = Stack(spec)
    try:
        stack.start_workers()
        if setup.workers_nice:
            lowered = renice([c.proc.pid for c in stack.children if c.proc is not None],
                             setup.workers_nice)  # fmt: skip
            log(f"workers and master at nice {setup.workers_nice}: {lowered} processes")
        workers = stack.worker_urls
        writers = [w.url for w in stack.workers if w.role != "decode"]
        log(f"workers: {' '.join(workers)}")
        for draw, name, rate in plan(setup):
            kept = stored_run(work, name, rate, draw) if resume else None
            if kept is not None:
                runs.append(kept)
                log(f"{name:28s} rate {rate:g} draw {draw}: kept from an earlier run")
                continue
            slug = slug_of(name, rate, draw)
            router_log = work / f"{slug}.router.log"
            with router_on_free_port(name, spec, workers, sglang_py, stack, model,
                                     router_log) as (url, proc):  # fmt: skip
                flush(workers, l3, writers)
                p0, c0 = token_counters(workers)
                s0 = router_samples(url)
                d0, k0 = decisions(s0), l3_lookups(s0)
                out = work / f"{slug}.jsonl"
                out.unlink(missing_ok=True)
                cmd = bench_argv(sglang_py, url, model, load, setup, rate, out, tok, draw)
                t0 = time.monotonic()
                cpu0, _ = tree_cpu_rss(proc.pid)
                with (work / f"{slug}.bench.log").open("wb") as blog:
                    rc = subprocess.run(cmd, env=bench_env(), stdout=blog,
                                        stderr=subprocess.STDOUT).returncode  # fmt: skip
                cpu1, _ = tree_cpu_rss(proc.pid)
                if rc != 0 or not out.exists():
                    raise RuntimeError(f"bench_serving failed ({rc}); see {work}/{slug}.bench.log")
                p1, c1 = token_counters(workers)
                s1 = router_samples(url)
                d1, k1 = decisions(s1), l3_lookups(s1)
                calls = {}
                if setup.agent and rate == setup.rates[0] and draw == 1:
                    flush(workers, l3, writers)
                    calls = tool_call_check(url, model, tok, setup.tool_sessions)
            result = json.loads(out.read_text().splitlines()[-1])
            made, decide_ms, stages = split_decisions(d0, d1)
            run = Run(
                name,
                rate,
                result,
                p1 - p0,
                c1 - c0,
                made,
                shlex.join(cmd),
                load.turns,
                calls,
                draw,
                cpu1 - cpu0,
                decide_ms,
                stages,
                {k: v - k0.get(k, 0.0) for k, v in k1.items() if v > k0.get(k, 0.0)},
            )
            runs.append(run)
            (work / f"{slug}.run.json").write_text(json.dumps(run.sidecar()))
            lookups_note = f", L3 lookups: {_lookups(run.l3_lookups)}" if run.l3_lookups else ""
            log(f"{name:28s} rate {rate:g} draw {draw}: {result['completed']} req in "
                f"{result['duration']:.1f} s (wall {time.monotonic() - t0:.0f} s), "
                f"goodput {result.get('request_goodput', 0):.2f} req/s, TTFT p90 "
                f"{result['p90_ttft_ms']:.0f} ms, cached {_pct(run.cached_share)}, history hit "
                f"{_pct(run.history_hit)}, sticky {_pct(run.stickiness)}, "
                f"router CPU {_ms(run.router_cpu_ms)} ms/req, decision "
                f"{_ms(run.decide_ms)} ms{_stages(run.decide_stages_ms)}"
                f"{lookups_note}")  # fmt: skip
    finally:
        stack.stop()
    return runs


def _stages(ms: dict[str, float]) -> str:
    parts = ", ".join(f"{k} {v:.1f}" for k, v in ms.items())
    return f" ({parts})" if parts else ""


def _lookups(counts: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.0f}" for k, v in sorted(counts.items()))


def tool_call_check(url: str, model: str, tokenizer: str, sessions: int) -> dict[str, Any]:
    """Agent sessions with structured tool calls through the router (bench_serving cannot send
    them): the share of follow-ups that found their previous prompt cached where they ran."""
    run = run_sessions(url, sessions=sessions, turns=4, max_tokens=16, model=model,
                       tokenizer_path=tokenizer, tools=True)  # fmt: skip
    report = asyncio.run(run)
    reasons = report.reasons()
    sticky = reasons.get("sticky", 0) if reasons.get("first-turn-balance") else None
    return {"sessions": sessions, "followups": len(report.followups()),
            "prompt_covered": report.prompt_covered_share(), "sticky": sticky}  # fmt: skip


def plan(setup: Setup) -> list[tuple[int, str, float]]:
    """(draw, router, rate) in the order they run."""
    return [(d, name, rate) for d in range(1, setup.draws + 1) for name in setup.routers
            for rate in setup.rates]  # fmt: skip


def slug_of(name: str, rate: float, draw: int = 1) -> str:
    tail = f"_d{draw}" if draw > 1 else ""  # draw 1 keeps the names of single-draw work dirs
    return re.sub(r"[^a-z0-9]+", "_", f"{name}_{rate:g}{tail}".lower())


def stored_run(work: Path, name: str, rate: float, draw: int) -> Run | None:
    """The run a previous invocation left in `work` (bench_serving JSONL + sidecar), if any."""
    slug = slug_of(name, rate, draw)
    side_file, out = work / f"{slug}.run.json", work / f"{slug}.jsonl"
    if not side_file.exists() or not out.exists():
        return None
    side = json.loads(side_file.read_text())
    result = json.loads(out.read_text().splitlines()[-1])
    return Run(name, rate, result, side["worker_prompt_tokens"], side["worker_cached_tokens"],
               side["decisions"], side["command"], tuple(side["turns"]),
               side.get("tool_calls") or {}, side.get("draw", 1),
               side.get("router_cpu_s"), side.get("decide_ms"),
               side.get("decide_stages_ms") or {}, side.get("l3_lookups") or {})  # fmt: skip


def load_runs(setup: Setup, work: Path) -> list[Run]:
    """The runs a previous invocation left in `work`, every one the setup names."""
    runs = []
    for draw, name, rate in plan(setup):
        run = stored_run(work, name, rate, draw)
        if run is None:
            raise SystemExit(f"no run of {name} at {rate:g} (draw {draw}) in {work}")
        runs.append(run)
    return runs


# --- report -------------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


def _shares(x: tuple[float, float] | None) -> str:
    return "n/a" if x is None else f"{100 * x[0]:.1f} / {100 * x[1]:.1f} %"


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}"


def _values(runs: list[Run], name: str, rate: float, key: str) -> list[float]:
    """`key` of bench_serving's result (or a Run property) over the draws of one point."""
    out = []
    for r in runs:
        if r.router == name and r.rate == rate:
            v = getattr(r, key) if hasattr(Run, key) else r.result.get(key, 0)
            if v is not None:
                out.append(float(v))
    return out


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _spread(xs: list[float], fmt: str = ".2f", scale: float = 1.0, unit: str = "") -> str:
    """mean [min-max], or the one value of a single draw."""
    if not xs:
        return "n/a"
    m, lo, hi = _mean(xs) * scale, min(xs) * scale, max(xs) * scale
    return f"{m:{fmt}}{unit}" if len(xs) == 1 else f"{m:{fmt}}{unit} [{lo:{fmt}}–{hi:{fmt}}]"


def knee(runs: list[Run], setup: Setup, threshold: float = 0.9) -> float:
    """The highest swept rate at which the best router still keeps >= threshold of its requests
    in SLO (on the mean of its draws): the most load the cluster can serve, where routers differ
    most (the lowest rate when none does)."""
    ok = [rate for name in setup.routers for rate in setup.rates
          if _mean(_values(runs, name, rate, "slo_attainment")) >= threshold]  # fmt: skip
    return max(ok) if ok else min(setup.rates)


def max_rate_in_slo(runs: list[Run], name: str, threshold: float = 0.9) -> str:
    """The highest swept rate up to which every rate kept >= threshold of requests in SLO (on the
    mean of its draws)."""
    best = None
    for rate in sorted({r.rate for r in runs if r.router == name}):
        if _mean(_values(runs, name, rate, "slo_attainment")) < threshold:
            break
        best = rate
    return "none" if best is None else f"{best:g}"


def turn_lines(runs: list[Run], setup: Setup) -> list[str]:
    """TTFT split into first turns and follow-ups per run: past the knee the routers keep
    different shares in SLO by letting different requests wait."""
    import numpy as np

    split = [(r, r.turn_ttfts) for r in runs]
    shown = [(r, t) for r, t in split if t is not None and t[0] and t[1]]
    if not shown:
        return []
    slo_s = setup.slo_ttft_ms / 1e3

    def cells(ttfts: list[float]) -> str:
        p50, p90 = np.percentile(np.array(ttfts) * 1e3, [50, 90])
        over = sum(t > slo_s for t in ttfts) / len(ttfts)
        return f"{p50:.0f} / {p90:.0f} | {100 * over:.0f} %"

    lines = [
        "",
        "TTFT by turn (bench_serving's per-request ttfts, its outputs in the conversations' "
        "order): first turns against follow-ups, and the share of each whose TTFT alone is over "
        f"the {setup.slo_ttft_ms:g} ms SLO.",
        "",
        "| router | rate (conv/s) | draw | first turns: TTFT p50 / p90 (ms) | over | "
        "follow-ups: TTFT p50 / p90 (ms) | over |",
        "|---|---|---|---|---|---|---|",
    ]
    for r, (first, follow) in sorted(
        shown, key=lambda x: (setup.routers.index(x[0].router), x[0].rate, x[0].draw)
    ):
        lines.append(f"| {r.router} | {r.rate:g} | {r.draw} | {cells(first)} | {cells(follow)} |")
    return lines


def draws_lines(runs: list[Run], setup: Setup) -> list[str]:
    """Each point over its draws, and the first router against the best of the others draw by
    draw (same arrivals): the spread a claim needs on a machine whose single runs scatter."""
    lines = [
        "",
        f"Over {setup.draws} draws (bench_serving `--seed` 1–{setup.draws}: the conversations' "
        "Poisson start times; the conversations and their order stay), mean [min–max]:",
        "",
        "| router | rate (conv/s) | goodput (req/s) | in SLO | TTFT p90 (ms) | cached share | "
        "router CPU (ms/req) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in setup.routers:
        for rate in setup.rates:
            lines.append(
                f"| {name} | {rate:g} | {_spread(_values(runs, name, rate, 'request_goodput'))} | "
                f"{_spread(_values(runs, name, rate, 'slo_attainment'), '.0f', 100, ' %')} | "
                f"{_spread(_values(runs, name, rate, 'p90_ttft_ms'), '.0f')} | "
                f"{_spread(_values(runs, name, rate, 'cached_share'), '.1f', 100, ' %')} | "
                f"{_spread(_values(runs, name, rate, 'router_cpu_ms'), '.1f')} |"
            )
    first, others = setup.routers[0], setup.routers[1:]
    if not others:
        return lines
    lines += [
        "",
        f"`{first}` against the best of the others in the same draw (goodput: its over the "
        "highest other; TTFT p90: its over the lowest other), mean [min–max] over draws. "
        "Goodput is the requests in SLO over the run's length (first request to last reply), "
        "so its ratio is the product of two: the best other's run length over this one's, and "
        "this one's requests in SLO over the best other's (every run sends the same requests). "
        "The first is how the last conversations drain, which dominates a short run:",
        "",
        "| rate (conv/s) | goodput ratio | TTFT p90 ratio | from the run's length | "
        "from the requests in SLO |",
        "|---|---|---|---|---|",
    ]
    for rate in setup.rates:
        good, ttft, length, in_slo = [], [], [], []
        for d in range(1, setup.draws + 1):
            at = {r.router: r.result for r in runs if r.rate == rate and r.draw == d}
            rivals = [at[o] for o in others if o in at]
            if first not in at or not rivals:
                continue
            top = max(rivals, key=lambda x: x.get("request_goodput", 0))
            best = top.get("request_goodput", 0)
            low = min(x["p90_ttft_ms"] for x in rivals)
            if best > 0:
                ratio = at[first].get("request_goodput", 0) / best
                good.append(ratio)
                if at[first].get("duration") and top.get("duration"):
                    length.append(top["duration"] / at[first]["duration"])
                    in_slo.append(ratio / length[-1])
            if low > 0:
                ttft.append(at[first]["p90_ttft_ms"] / low)
        lines.append(f"| {rate:g} | {_spread(good, '.3f')} | {_spread(ttft, '.3f')} | "
                     f"{_spread(length, '.3f')} | {_spread(in_slo, '.3f')} |")  # fmt: skip
    return lines


def cluster_line(spec: ClusterSpec) -> str:
    w, pd = spec.workers, spec.pd
    if pd is None:
        kinds = f"{w.count} {w.kind} workers"
    else:  # the routers front both roles: prefill instances with their bootstrap ports, decode
        kinds = (f"{w.kind} workers disaggregated, {pd.prefill} prefill and {pd.decode} decode "
                 f"(KV link {pd.transfer_gbps:g} Gbps)")  # fmt: skip
    if w.kind == "emulated":
        return (f"{kinds} (profile {w.profile}, speedup {w.speedup:g}, "
                f"extra args `{' '.join(w.extra_args)}`)")  # fmt: skip
    g = spec.sglang
    return (f"{kinds} (model `{g.model_path}`, device {g.device}, "
            f"--max-total-tokens {g.max_total_tokens}, HiCache {'on' if g.hicache else 'off'}, "
            f"page size {w.page_size})")  # fmt: skip


def workload_lines(setup: Setup, meta: dict[str, Any]) -> list[str]:
    if setup.dataset == "mooncake":
        return [
            f"- Workload: the first {meta['conversations']} records of `{meta['source']}` whose "
            f"last round stays within {meta['max_prompt_tokens']} tokens "
            f"({100 * meta['kept_share']:.0f} % of the trace's records do; their timestamps "
            f"kept), {meta['mean_hash_ids']} hash ids and "
            f"{meta['mean_output_tokens']} output tokens per record on average, each a "
            f"session of {meta['rounds']} rounds, as bench_serving's own Mooncake replay "
            'builds them: every hash id becomes its number and 128 × "hi", a round\'s user '
            "message re-states the record's text, the prompt is the session's history with a "
            'placeholder assistant reply ("story" × output length) between rounds, rendered '
            "with the tokenizer's chat template on the client.",
            "- Driver: SGLang 0.5.23 `python -m sglang.benchmark.serving --backend sglang "
            f"--dataset-name mooncake --mooncake-num-rounds {meta['rounds']}` (its Mooncake "
            "mode runs on the native backend only: text prompts to `/generate`, which every "
            "router here serves). Sessions start at their trace timestamps scaled by "
            "`--mooncake-slowdown-factor` (the rate column: sessions/s, the factor = the "
            f"trace's {meta['trace_sessions_per_s']:.2f} sessions/s over it); a session's rounds "
            "are sent together, so a round can only reuse an earlier round's prefill if it has "
            "finished; streaming, output lengths from the trace.",
        ]
    return [
        f"- Workload: {meta['conversations']} conversations, {meta['turns']} turns (max "
        f"{meta['max_turns']}), converted from `{meta['source']}` ({meta['format']}) by "
        f"`smetric_router.traces.to_agentic` at {meta['tokens_per_block']} tokens per "
        f"{meta['block_size']}-token block (first prompt ~{meta['mean_first_prompt_tokens']} "
        f"tokens); replies {setup.output_len} tokens (`--sharegpt-output-len`; the trace's mean "
        f"is {meta['mean_output_tokens']}).",
        "- Driver: SGLang 0.5.23 `python -m sglang.benchmark.serving --backend sglang-oai-chat "
        "--dataset-name agentic-trace`, `--request-rate` = conversations/s (Poisson), each "
        "turn sent when the previous reply ends; streaming.",
    ]


def report(runs: list[Run], setup: Setup, meta: dict[str, Any], spec: ClusterSpec,
           argv: Sequence[str], out_md: Path, elapsed_s: float) -> None:  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    stem = out_md.stem
    k = knee(runs, setup)
    lines = [
        f"# bench_serving comparison ({stem})",
        "",
        f"Command: `python -m benchmarks.compare {' '.join(argv)}` ({elapsed_s / 60:.1f} min on "
        "this 2-core machine, shared with other work).",
        "",
        f"- Cluster: {cluster_line(spec)}, each router on a free loopback port in front of the "
        "same workers, worker caches flushed before every run."
        + (
            " Global tier: a real `mooncake_master` (HiCache L3 under SGLang's keys; the "
            "routers' L3 view from the master), emptied between runs (SGLang's "
            "`POST /hicache/storage-backend/clear`, until the master counts no key)."
            if spec.mooncake is not None
            else ""
        ),
        *workload_lines(setup, meta),
        f"- SLO (`--goodput`): TTFT ≤ {setup.slo_ttft_ms:g} ms and TPOT ≤ {setup.slo_tpot_ms:g} "
        "ms. "
        "Max rate in SLO: the highest swept rate up to which every rate had ≥ 90 % of requests "
        "in SLO. The knee: the "
        "highest swept rate at which the best router still has ≥ 90 % in SLO.",
        "- Cached share: the workers' own counters (`sglang:cached_tokens_total` / "
        "`sglang:prompt_tokens_total`) over the run; on the GPU: the share of first turns' and "
        "of follow-ups' prompt tokens the worker found in its GPU tier (bench_serving's "
        "per-request `cached_tokens_details`), the rest of the cached share loaded from the host "
        "or the global tier first. Follow-ups with history cached: the share "
        "of follow-up turns whose previous prompt (all but its last partial page) was cached "
        "where they ran, from bench_serving's per-request `cached_tokens` ("
        + (
            "`meta_info` of `/generate`). "
            if setup.dataset == "mooncake"
            else "n/a where the router does not pass SGLang's `sglext` through: sglang-router "
            "0.3.2). "
        )
        + "Stickiness: "
        "smetric-router's decisions "
        "(`sticky` + `sticky-l3` over all follow-up decisions) for the smetric policy; n/a where "
        "the router does not say (peers; smetric-router's baseline policies only report their own "
        "name). Router CPU: user+system seconds of the router's processes (the whole tree, "
        "psutil) while bench_serving ran, per completed request (n/a for runs kept from before "
        "it was recorded). Decision: smetric-router's mean time from a request's arrival to its "
        "routing decision (body read, features, views, policy; its "
        "`smetric_decision_seconds`), what it adds before the worker sees the request (n/a for "
        "the peers, which do not report it, and for several processes, whose scrapes may reach "
        "different ones).",
        "- Emulated workers model H20 timing in real time on this CPU; the router, the workers "
        "and the client share 2 cores, so absolute numbers include their Python overheads."
        + (
            f" The workers and the Mooncake master ran at nice {setup.workers_nice} "
            "(`--workers-nice`): the router and the load client had the CPU first, as a router on "
            "its own cores would."
            if setup.workers_nice
            else ""
        )
        if spec.workers.kind == "emulated"
        else "- Real SGLang 0.5.23 workers on this CPU serving the tiny random-weight Qwen3 "
        "(`--load-format dummy`; the model's Qwen3-Coder-style template renders tools in the "
        "system turn): token counts, caching and the template are real, timing is this 2-core "
        "CPU's shared with the router and the client, not a GPU's.",
        *(
            [
                "- Agent shape (`--agent`): every request carries "
                f"{len(meta.get('tools', []))} coding-agent tool definitions "
                "(`--extra-request-body`; the template puts them in the system turn) and follow-up "
                "turns read as tool output (a newline and indentation first) in user messages: "
                "bench_serving's multi-turn replay keeps only role and content, and a `role: tool` "
                "message without `tool_call_id` is refused by smg (400). The assistant turns are "
                "the server's own replies; structured tool calls are checked below."
            ]
            if setup.agent
            else []
        ),
        "",
        "| router | rate (conv/s) | "
        + ("draw | " if setup.draws > 1 else "")
        + "req/s | out tok/s | goodput (req/s) | in SLO | "
        "TTFT p50 / p90 / p99 (ms) | TPOT p50 / p90 / p99 (ms) | cached share | "
        "on the GPU: first turns / follow-ups | "
        "follow-ups with history cached | stickiness | router CPU (ms/req) | decision (ms) |",
        "|---" * (14 + (setup.draws > 1)) + "|",
    ]
    for r in sorted(runs, key=lambda r: (setup.routers.index(r.router), r.rate, r.draw)):
        x = r.result
        draw = f"{r.draw} | " if setup.draws > 1 else ""
        lines.append(
            f"| {r.router} | {r.rate:g} | {draw}{x['request_throughput']:.2f} | "
            f"{x['output_throughput']:.0f} | {x.get('request_goodput', 0):.2f} | "
            f"{100 * x.get('slo_attainment', 0):.0f} % | {x['median_ttft_ms']:.0f} / "
            f"{x['p90_ttft_ms']:.0f} / {x['p99_ttft_ms']:.0f} | {x['median_tpot_ms']:.1f} / "
            f"{x['p90_tpot_ms']:.1f} / {x['p99_tpot_ms']:.1f} | {_pct(r.cached_share)} | "
            f"{_shares(r.device_shares)} | {_pct(r.history_hit)} | {_pct(r.stickiness)} | "
            f"{_ms(r.router_cpu_ms)} | {_ms(r.decide_ms)} |"
        )
    lines += ["", "| router | max rate in SLO (conv/s) | goodput at the knee "
              f"({k:g} conv/s) | TTFT p90 at the knee (ms) |", "|---|---|---|---|"]  # fmt: skip
    for name in setup.routers:
        lines.append(f"| {name} | {max_rate_in_slo(runs, name)} | "
                     f"{_spread(_values(runs, name, k, 'request_goodput'))} | "
                     f"{_spread(_values(runs, name, k, 'p90_ttft_ms'), '.0f')} |")  # fmt: skip
    lines += turn_lines(runs, setup)
    looked = [r for r in runs if r.l3_lookups]
    if looked:
        lines += ["", "smetric-router's decisions per run: mean arrival-to-decision time by stage "
                  "(`l3`: waiting for the global tier's answer where the decision turns on it) "
                  "and the global tier's lookups by outcome (timeout: over --l3-budget-secs, "
                  "decided as unknown).", "",
                  "| router | rate (conv/s) | draw | decision (ms) by stage | L3 lookups |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for r in sorted(looked, key=lambda r: (setup.routers.index(r.router), r.rate, r.draw)):
            lines.append(f"| {r.router} | {r.rate:g} | {r.draw} | {_ms(r.decide_ms)}"
                         f"{_stages(r.decide_stages_ms)} | "
                         f"{_lookups(r.l3_lookups)} |")  # fmt: skip
    if setup.draws > 1:
        lines += draws_lines(runs, setup)
    checked = [r for r in runs if r.tool_calls]
    if checked:
        lines += ["", "Structured tool calls (bench_serving cannot send them): per router, "
                  f"{checked[0].tool_calls['sessions']} sessions of 4 turns from "
                  "`smetric_router.loadgen.sessions --tools` (tool definitions, each reply sent "
                  "back with an assistant `tool_calls` entry, then a `role: tool` result), "
                  "caches flushed first. Previous prompt cached: follow-ups whose "
                  "`usage.prompt_tokens_details.cached_tokens` reach the previous request's full "
                  "prompt pages where they ran.", "",
                  "| router | follow-ups | previous prompt cached | sticky decisions |",
                  "|---|---|---|---|"]  # fmt: skip
        for r in checked:
            tc = r.tool_calls
            sticky = "n/a" if tc["sticky"] is None else f"{tc['sticky']} / {tc['followups']}"
            lines.append(f"| {r.router} | {tc['followups']} | {_pct(tc['prompt_covered'])} | "
                         f"{sticky} |")  # fmt: skip
    fail = [r for r in runs if r.result["completed"] < meta["turns"]]
    if fail:
        lines += [
            "",
            "Runs with failed requests: "
            + ", ".join(
                f"{r.router} @ {r.rate:g}{f' draw {r.draw}' if setup.draws > 1 else ''} "
                f"({meta['turns'] - r.result['completed']} failed)"
                for r in fail
            ),
        ]
    lines += ["", f"![goodput vs rate]({stem}_goodput.png)",
              f"![TTFT CDF at the knee]({stem}_ttft_cdf.png)", "",
              "bench_serving command of the first run:", "", "```",
              runs[0].command if runs else "", "```", ""]  # fmt: skip
    out_md.write_text("\n".join(lines))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in setup.routers:
        rates = sorted({r.rate for r in runs if r.router == name})
        vals = [_values(runs, name, rate, "request_goodput") for rate in rates]
        mean = np.array([_mean(v) for v in vals])
        err = np.array([[m - min(v) for m, v in zip(mean, vals, strict=True)],
                        [max(v) - m for m, v in zip(mean, vals, strict=True)]])  # fmt: skip
        ax.errorbar(rates, mean, yerr=err if setup.draws > 1 else None, marker="o", capsize=3,
                    label=name, linestyle="-" if name.startswith("smetric") else "--")  # fmt: skip
    ax.set_xlabel("request rate (conversations/s)")
    ax.set_ylabel("goodput (requests/s in SLO)")
    ax.set_title(
        f"goodput vs rate (TTFT ≤ {setup.slo_ttft_ms:g} ms, TPOT ≤ {setup.slo_tpot_ms:g} ms)"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_md.with_name(f"{stem}_goodput.png"), dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in runs:
        if r.rate != k or r.draw != 1:
            continue
        t = np.sort(np.array([v for v in r.result.get("ttfts", []) if v and v > 0]) * 1000)
        if len(t):
            ax.plot(t, np.arange(1, len(t) + 1) / len(t), label=r.router,
                    linestyle="-" if r.router.startswith("smetric") else "--")  # fmt: skip
    ax.axvline(setup.slo_ttft_ms, color="grey", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (ms)")
    ax.set_ylabel("share of requests")
    ax.set_title(f"TTFT CDF at the knee ({k:g} conversations/s)"
                 + (", draw 1" if setup.draws > 1 else ""))  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_md.with_name(f"{stem}_ttft_cdf.png"), dpi=110)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.compare", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="3 workers, 16 conversations, 2 rates")
    p.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)  # the test's size
    p.add_argument("--config", type=Path, help="cluster spec YAML (default: emulated workers)")
    p.add_argument("--trace", type=Path, help="trace JSONL (default: a generated agentic trace)")
    p.add_argument("--routers", help=f"comma-separated subset of: {', '.join(ROUTERS)}")
    p.add_argument("--rates", help="comma-separated conversation rates (per s)")
    p.add_argument("--workers", type=int, help="colocated workers (over --config's count)")
    p.add_argument("--conversations", type=int)
    p.add_argument("--max-turns", type=int)
    p.add_argument("--min-turns", type=int)
    p.add_argument("--sessions", type=int, help="root sessions of the generated trace")
    p.add_argument("--gpu-kv-tokens", type=int, help="per emulated worker")
    p.add_argument("--speedup", type=float, help="emulated workers' model s per wall s")
    p.add_argument("--tokens-per-block", type=int)
    p.add_argument("--output-len", type=int)
    p.add_argument("--max-prompt-tokens", type=int)
    p.add_argument("--slo-ttft-ms", type=float)
    p.add_argument("--slo-tpot-ms", type=float)
    p.add_argument(
        "--agent",
        action="store_true",
        default=None,
        help="agent-shaped requests: tool results, tool definitions, tool-call check",
    )
    p.add_argument("--tool-sessions", type=int, help="--agent: tool-call sessions per router")
    p.add_argument(
        "--dataset",
        choices=("agentic-trace", "mooncake"),
        help="bench_serving dataset (default agentic-trace; mooncake: its Mooncake "
        "replay of --trace, default ../shared/traces/mooncake-conversation.jsonl, "
        "--conversations sessions of --rounds rounds)",
    )
    p.add_argument("--rounds", type=int, help="mooncake: rounds per session (default 3)")
    p.add_argument("--draws", type=int,
                   help="arrival draws per router and rate (bench_serving --seed 1..N; default "
                   "1): the report gives each point's mean [min-max] and the first router's "
                   "ratio to the best other, draw by draw")  # fmt: skip
    p.add_argument("--workers-nice", type=int,
                   help="run the workers and the Mooncake master at this nice value (default 0; "
                   "e.g. 10: the router under test and the load client get the CPU first, as a "
                   "router on its own cores would, so a costlier router is not slowed by the "
                   "workers it shares 2 cores with)")  # fmt: skip
    p.add_argument("--enable-priority-scheduling", action="store_true",
                   help="start the workers with SGLang's --enable-priority-scheduling "
                   "--default-priority-value 0 (a request asking a higher `priority` goes first "
                   "in its worker's queue; routers that set none are served in arrival order as "
                   "before); on by itself when a "
                   f"router in the run sets {PRIORITY_FLAG}")  # fmt: skip
    p.add_argument("--tag", default="", help="results file suffix: compare-TAG.md")
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/smetric-compare"))
    p.add_argument("--resume", action="store_true",
                   help="keep the runs an earlier invocation of the same workload left in the "
                   "work dir and run only the missing ones (an interrupted sweep, or more "
                   "draws, rates or routers)")  # fmt: skip
    p.add_argument("--report-only", action="store_true",
                   help="rewrite the report from the runs already in the work dir")  # fmt: skip
    return p


def setup_from(a: argparse.Namespace) -> Setup:
    s = SMOKE if a.smoke else QUICK if a.quick else Setup()
    if a.routers:
        names = tuple(x.strip() for x in a.routers.split(",") if x.strip())
        unknown = [n for n in names if n not in ROUTERS]
        if unknown:
            raise SystemExit(f"unknown routers {unknown}; known: {', '.join(ROUTERS)}")
        s = replace(s, routers=names)
    if a.rates:
        s = replace(s, rates=tuple(float(x) for x in a.rates.split(",")))
    if a.draws is not None and a.draws < 1:
        raise SystemExit("--draws must be >= 1")
    for key in ("workers", "conversations", "max_turns", "min_turns", "sessions", "gpu_kv_tokens",
                "speedup", "tokens_per_block", "output_len", "max_prompt_tokens", "slo_ttft_ms",
                "slo_tpot_ms", "agent", "tool_sessions", "dataset", "rounds", "draws",
                "workers_nice"):  # fmt: skip
        if getattr(a, key) is not None:
            s = replace(s, **{key: getattr(a, key)})
    return s


def cluster_spec(a: argparse.Namespace, setup: Setup) -> ClusterSpec:
    """The cluster to run: --config's, with the worker flags given on the command line applied
    over it (an emulated-worker flag on real workers is an error, not silently dropped)."""
    if not a.config:
        return default_spec(setup)
    spec = load_spec(a.config)
    workers = spec.workers
    if a.workers and spec.pd is not None:
        raise SystemExit(f"--workers: {a.config} disaggregates prefill and decode; its pd section "
                         "sets how many of each")  # fmt: skip
    if a.workers:
        workers = replace(workers, count=a.workers)
    emulated_only = {"--gpu-kv-tokens": a.gpu_kv_tokens, "--speedup": a.speedup}
    given = [flag for flag, v in emulated_only.items() if v is not None]
    if given and workers.kind != "emulated":
        raise SystemExit(f"{', '.join(given)}: only for emulated workers ({a.config} has "
                         f"{workers.kind} workers)")  # fmt: skip
    if a.gpu_kv_tokens is not None:
        workers = replace(workers, extra_args=(*workers.extra_args, "--gpu-kv-tokens",
                                               str(a.gpu_kv_tokens)))  # fmt: skip
    if a.speedup is not None:
        workers = replace(workers, speedup=a.speedup)
    # a router asking follow-ups' priority orders nothing unless the workers read it; the
    # others send none, so their requests keep arrival order
    asking = any(PRIORITY_FLAG in ROUTERS[n].extra for n in setup.routers)
    if (a.enable_priority_scheduling or asking) and PRIORITY_SCHEDULING[
        0
    ] not in workers.extra_args:
        workers = replace(workers, extra_args=(*workers.extra_args, *PRIORITY_SCHEDULING))
    return replace(spec, workers=workers)


def main(argv: Sequence[str] | None = None) -> list[Run]:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    setup = setup_from(a)
    spec = cluster_spec(a, setup)
    if spec.workers.kind == "sglang":  # the cached share comes from the workers' counters
        spec = replace(spec, sglang=replace(spec.sglang, metrics=True))
    work = a.work_dir / (a.tag or ("smoke" if a.smoke else "quick" if a.quick else "full"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    summary = work / "summary.json"
    if a.report_only:
        load = Workload.load(work)
        runs = load_runs(setup, work)
        prev = json.loads(summary.read_text()) if summary.exists() else {}
        argv, elapsed = prev.get("argv", argv), prev.get("elapsed_s", 0.0)
    else:
        load = workload(setup, a.trace, work)
        before = 0.0
        if a.resume and (work / "workload.json").exists():
            if Workload.load(work).meta != json.loads(json.dumps(load.meta)):
                raise SystemExit(f"--resume: {work} holds runs of another workload")
            prev = json.loads(summary.read_text()) if summary.exists() else {}
            before = prev.get("elapsed_s", 0.0)
        load.save(work)
        print(f"workload: {load.meta}", flush=True)
        runs = run_all(setup, spec, load, work, log=lambda s: print(s, flush=True),
                       resume=a.resume)  # fmt: skip
        elapsed = before + time.monotonic() - t0
        summary.write_text(json.dumps({"argv": argv, "elapsed_s": elapsed}))
    name = "compare" + (
        f"-{a.tag}" if a.tag else "-smoke" if a.smoke else "-quick" if a.quick else ""
    )
    a.out_dir.mkdir(parents=True, exist_ok=True)
    out = a.out_dir / f"{name}.md"
    report(runs, setup, load.meta, spec, argv, out, elapsed)
    print(f"wrote {out}")
    return runs


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through run_all's finally: the workers stop too


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    main()
