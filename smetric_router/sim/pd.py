"""PD disaggregation in the simulator: prefill instances only (`python -m smetric_router.sim --pd`).

Decode is out of scope: under disaggregation KV reuse only matters at prefill, and the paper's
§5.3 measures the prefill instances alone (prefill TPS within SLO and TTFT). Each instance is an
`engine.Engine` that prefills prompts and emits the first token (output length 1, as an SGLang
prefill server does), sharing the same global tier and server links as the colocated simulator.

The router's own policy objects choose the prefill instance, with the view the router's PD mode
builds (router/workers.py, router/pd.py):
- load = unprefilled tokens: per instance, prompt tokens dispatched and not yet prefilled, each
  request counting its prompt minus the local hit the view showed at dispatch, until its prefill
  ends (the step that emits its first token). The router's own count is exact for one router, so
  the worker-reported `num_waiting_uncached_tokens` correction (other router replicas' load) is
  not modelled;
- running stays None, as in the router's PD views: LMetric then scores by the unprefilled
  tokens (policies/lmetric.py);
- hit / gpu_hit, turn and est_hit as in the colocated simulator (sim/cluster.py);
- prefill_only set, as the router sets it for its prefill instances.

Step semantics are the colocated simulator's: a step's effect on the engine applies when it
starts, what the router observes of it (prefill done) when it ends; requests arriving mid-step
join the next step. TTFT here is the prefill's completion: the KV transfer to a decode instance
and the decode's first step are not included.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from smetric_router.core.decay import RECENT_HALF_LIFE_S, DecayingSum
from smetric_router.core.types import ClusterView, RequestFeatures, WorkerView
from smetric_router.engine.api import EngineRequest, StepResult
from smetric_router.engine.engine import Engine
from smetric_router.engine.timing import TimingModel
from smetric_router.policies.base import Policy
from smetric_router.policies.follow_up_priority import follow_up_priority
from smetric_router.sim.cluster import (
    RequestRecord,
    SimInstance,
    add_to_windows,
    arrival_order,
    router_features,
)
from smetric_router.sim.collect import with_rare_collections
from smetric_router.sim.config import SimConfig, Slo
from smetric_router.sim.metrics import imbalance_mean, percentile, placement, tier_fields
from smetric_router.sim.pages import PageMapper
from smetric_router.sim.tiers import HiCachePrefetch, TierPort, Tiers, prefetch_wake
from smetric_router.traces.schema import TraceRequest


@dataclass(slots=True)
class PdRunResult:
    """records: first_token = finish = prefill done (-1: dropped, could never fit).
    window_load: [window][instance] time-averaged unprefilled tokens (the router's load signal).
    window_tokens: [window][instance] tokens computed (prefill computed + the first token)."""

    records: list[RequestRecord]
    window_load: list[list[float]]
    window_s: float
    window_tokens: list[list[float]] = field(default_factory=list)
    tier_mode: str = "paper"
    link_busy_s: tuple[float, ...] = ()
    global_fetch_bytes: float = 0.0
    global_write_bytes: float = 0.0


def trace_pages(trace: Sequence[TraceRequest], page_size: int) -> list[np.ndarray]:
    """Every request's page hashes (prompt + the one output token), in arrival order.

    They depend on the trace alone, so a sweep computes them once and hands them to every run
    (hashing the pages is most of a run's time otherwise)."""
    mapper = PageMapper(page_size)
    return [
        np.asarray(mapper.pages(replace(trace[i], output_len=1), n), dtype=np.int64)
        for n, i in enumerate(arrival_order(trace))
    ]


class _Prefill(SimInstance):
    __slots__ = ("load", "load_since")

    def __init__(
        self, idx: int, engine: Engine, port: TierPort | None, prefetch: HiCachePrefetch | None
    ) -> None:
        super().__init__(idx, engine, port, prefetch)
        self.load = 0  # unprefilled tokens as the router counts them
        self.load_since = 0.0


class PdCluster:
    """Prefill instances on a virtual clock; one run per object."""

    def __init__(
        self,
        cfg: SimConfig,
        policy: Policy,
        global_ratio: float,
        timing: TimingModel | None = None,
    ) -> None:
        if policy.uses_text_tree:
            raise ValueError(f"policy {policy.name!r} (text tree) is not modelled under --pd")
        if cfg.follow_ups != "trace":
            raise ValueError(f"--follow-ups {cfg.follow_ups} is not modelled under --pd")
        self.cfg = cfg
        self.policy = policy
        self.timing = timing or TimingModel.load(cfg.profile)
        self.tiers = Tiers(cfg, self.timing, global_ratio)
        self.global_tier = self.tiers.tier
        self.instances = [
            _Prefill(i, self.tiers.engine(i), self.tiers.port(i), self.tiers.prefetcher(i))
            for i in range(cfg.instances)
        ]
        self.urls = [f"sim-prefill-{i}" for i in range(cfg.instances)]
        self._url_index = {u: i for i, u in enumerate(self.urls)}
        self._heap: list[tuple[float, int, int, int]] = []
        self._seq = 0
        self._records: list[RequestRecord] = []
        self._held: dict[int, int] = {}  # request -> unprefilled tokens it adds to its instance
        self._recent = [DecayingSum(RECENT_HALF_LIFE_S) for _ in range(cfg.instances)]
        self._windows: list[list[float]] = []
        self._tokens: list[list[float]] = []

    # ---- load signal --------------------------------------------------------------------------

    def _add_load(self, inst: _Prefill, t: float, delta: int) -> None:
        """Change the instance's unprefilled tokens at t, integrating the old value over windows."""
        start, load = inst.load_since, inst.load
        if load > 0 and t > start:
            w = self.cfg.window_s
            windows = self._windows
            last = int(t // w)
            while len(windows) <= last:
                windows.append([0.0] * self.cfg.instances)
            for k in range(int(start // w), last + 1):
                lo, hi = max(start, k * w), min(t, (k + 1) * w)
                if hi > lo:
                    windows[k][inst.idx] += load * (hi - lo) / w
        inst.load_since = t
        inst.load = load + delta

    # ---- events -------------------------------------------------------------------------------

    def _schedule(self, inst: _Prefill, t: float) -> None:
        inst.busy = True
        inst.version += 1
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, inst.idx, inst.version))

    def _run_events(self, until: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= until:
            t, _, idx, version = heapq.heappop(heap)
            inst = self.instances[idx]
            if version != inst.version:
                continue
            if inst.result is not None:
                self._deliver(inst, inst.result, t)
                inst.result = None
            inst.clock = t
            inst.parked = False
            if not inst.engine.has_work():
                inst.busy = False
                continue
            if inst.port is not None:
                inst.port.now = t
            before = inst.engine.prefill_tokens_computed
            res = inst.engine.step()
            if inst.port is not None:
                inst.port.flush(t, t + res.duration)
            if res.duration == 0 and not res.finished:
                # every waiting request waits on its prefetch: wake when the first may stop
                inst.parked = True
                self._schedule(inst, prefetch_wake(inst.prefetch, t, inst.idx))
                continue
            tokens = inst.engine.prefill_tokens_computed - before + len(res.emitted)
            self._account(inst.idx, t, t + res.duration, tokens)
            for rid, cached in res.scheduled:
                rec = self._records[int(rid)]
                rec.cached_global = cached.storage
                rec.cached_local = cached.device + cached.host
            inst.result = res
            self._schedule(inst, t + res.duration)

    def _deliver(self, inst: _Prefill, res: StepResult, t: float) -> None:
        for rid, _ in res.emitted:
            rec = self._records[int(rid)]
            rec.first_token = rec.finish = t
        for rid in res.finished:  # prefilled, or dropped (could never fit): the load ends
            self._add_load(inst, t, -self._held.pop(int(rid)))

    def _account(self, idx: int, start: float, end: float, tokens: float) -> None:
        add_to_windows(self._tokens, self.cfg.instances, self.cfg.window_s, idx, start, end, tokens)

    # ---- arrivals -----------------------------------------------------------------------------

    @with_rare_collections
    def run(
        self,
        trace: Sequence[TraceRequest],
        rate_scale: float = 1.0,
        progress: Callable[[int], None] | None = None,
        pages: Sequence[np.ndarray] | None = None,
    ) -> PdRunResult:
        """pages: trace_pages(trace, page size), when a sweep has them already."""
        if rate_scale <= 0:
            raise ValueError(f"rate_scale must be > 0, got {rate_scale}")
        ps = self.cfg.page_size
        mapper = PageMapper(ps)
        rng = random.Random(self.cfg.seed)
        session_first: dict[str, int] = {}
        order = arrival_order(trace)
        t0 = trace[order[0]].arrival_s if order else 0.0
        for n, i in enumerate(order):
            req = replace(trace[i], output_len=1)  # a prefill server emits the first token only
            t = (req.arrival_s - t0) / rate_scale
            self._run_events(t)
            hashes = pages[n].tolist() if pages is not None else mapper.pages(req, n)
            prompt_pages = hashes[: req.input_len // ps]
            features = router_features(req, prompt_pages, ps, session_hint=self.cfg.session_hints)
            idx, hit = self._decide(features, prompt_pages[: (req.input_len - 1) // ps], n, rng, t)
            if req.turn == 0:
                session_first[req.session] = idx
            first = session_first.get(req.session, -1)
            self._records.append(
                RequestRecord(
                    t, req.input_len, trace[i].output_len, req.turn, idx, first, trace_index=i
                )
            )
            inst = self.instances[idx]
            unprefilled = max(0, req.input_len - hit)
            self._held[n] = unprefilled
            self._recent[idx].add(unprefilled, t)
            self._add_load(inst, t, unprefilled)
            if inst.port is not None:
                inst.port.now = t  # a prefetch starts at the arrival
            priority = follow_up_priority(req.router_turn, None, self.cfg.follow_up_priority)
            inst.engine.add_request(
                EngineRequest(str(n), [], [], hashes, req.input_len, 1, priority)
            )
            if not inst.busy or inst.parked:
                self._schedule(inst, t)
            if progress is not None:
                progress(1)
        self._run_events(math.inf)  # every load is back to 0: nothing left to integrate
        return PdRunResult(
            self._records,
            self._windows,
            self.cfg.window_s,
            self._tokens,
            self.cfg.tier_mode,
            tuple(link.busy_s for link in self.tiers.links),
            self.tiers.stats.fetch_bytes,
            self.tiers.stats.write_bytes,
        )

    def _decide(
        self,
        features: RequestFeatures,
        cacheable: list[int],
        tick: int,
        rng: random.Random,
        now: float,
    ) -> tuple[int, int]:
        """The chosen instance and the local hit the view showed for it."""
        ps = self.cfg.page_size
        workers = []
        l3 = self.global_tier.readable(cacheable) * ps if self.global_tier is not None else 0
        for i, inst in enumerate(self.instances):
            gpu, host = inst.engine.cache.match_len(cacheable)
            workers.append(
                WorkerView(
                    url=self.urls[i],
                    load=inst.load,
                    hit=(gpu + host) * ps,
                    gpu_hit=gpu * ps,
                    l3_hit=l3,
                    recent_tokens=self._recent[i].value(now),
                    prefill_only=True,
                )
            )
        view = ClusterView(tuple(workers), tick, rng.getrandbits(64))
        idx = self._url_index[self.policy.decide(features, view).worker]
        return idx, workers[idx].hit


def summarize_pd(
    run: PdRunResult, slo: Slo, policy: str, rate_scale: float, global_ratio: float
) -> dict[str, Any]:
    """One JSON row: the colocated schema (sim/metrics.py) with PD's meanings and fields.

    - prefill_tps: prompt tokens whose KV was produced (computed or reused from any tier) per
      second, over the span from the first arrival to the last prefill completion;
      prefill_tps_within_slo: the same, counting only requests whose TTFT met the SLO. `tps` and
      `tps_within_slo` repeat them (so max_tps_within_slo and the plots read prefill TPS).
    - ttft_*: seconds from arrival to prefill completion; tpot_* are null (no decode).
    - imbalance_mean: over windows with any load up to the one holding the last arrival (as in
      sim/metrics.py), max / mean of each instance's time-averaged unprefilled tokens (the paper's
      in-flight prefill-token load, Figure 21b).
    - reuse split and followup_stickiness as in the colocated rows; mode = "pd".
    - tier_mode, windows (tokens computed per window and instance: prefill computed + the first
      token), global_fetch_bytes, global_write_bytes, link_busy_share: as in sim/metrics.py.
    """
    ttft: list[float] = []
    tokens = good = 0
    end = 0.0
    for r in run.records:
        if r.first_token < 0:
            continue
        end = max(end, r.first_token)
        tokens += r.input_len
        t_first = r.first_token - r.arrival
        ttft.append(t_first)
        if t_first <= slo.ttft_limit(r.input_len):
            good += r.input_len
    start = min((r.arrival for r in run.records), default=0.0)
    span = end - start
    tps = tokens / span if span > 0 else 0.0
    tps_slo = good / span if span > 0 else 0.0
    nan = float("nan")
    where = placement(run.records)
    return {
        "mode": "pd",
        "policy": policy,
        "rate_scale": rate_scale,
        "global_ratio": global_ratio,
        "tps": tps,
        "tps_within_slo": tps_slo,
        "prefill_tps": tps,
        "prefill_tps_within_slo": tps_slo,
        "ttft_p50": percentile(ttft, 50),
        "ttft_p90": percentile(ttft, 90),
        "ttft_p99": percentile(ttft, 99),
        "tpot_p50": nan,
        "tpot_p90": nan,
        "tpot_p99": nan,
        "reuse_ratio": where.reuse_ratio,
        "local_hit_ratio": where.local_hit_ratio,
        "global_hit_ratio": where.global_hit_ratio,
        "imbalance_mean": imbalance_mean(run.window_load, run.records, run.window_s),
        "followup_stickiness": where.followup_stickiness,
        **tier_fields(run, span),
    }
