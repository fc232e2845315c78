"""The discrete-event cluster: Engines on a virtual clock, the router's policy objects in the loop.

Time advances from event to event. An instance's event is the end of the step it is running; the
step's effect on the engine (admissions, cache inserts) is applied when it starts, and what the
router can observe of it (first tokens, finishes, the in-flight count) when it ends. A request
routed to an instance mid-step waits for the next step, as in SGLang.

Pure-decode runs are not stepped one by one: when an instance's next steps are all pure decode
(Engine.decode_only_steps), the run up to the step before the next finish is planned as one event.
Those steps change neither the radix cache nor the in-flight counts, so the router's view is the
same whether they were applied or not; if a request arrives at the instance during the run, the
run is cut at the first step boundary after the arrival (Engine.step_many(until_seconds)).

Per decision the router sees (same fields as the real router fills):
- hit / gpu_hit: the local-tier (GPU, + host in hicache mode) and GPU-only prefix hit in that
  engine's radix cache;
- load: requests in flight at the instance (routed and not finished), the router's own count;
- unprefilled: the new tokens (prompt - the hit its view showed) of the requests routed there
  whose first token has not come back, the router's own count for streamed requests;
- running: the engine's running batch as the step in flight left it (admitted, not finished:
  the batch size its /v1/loads would report), without the requests still waiting;
- turn / est_hit: what the router reads off the request itself, the assistant replies it carries
  and its tokens through the last of them (TraceRequest.router_turn / history_len, written by the
  generator or derived by the loaders from the request's parent in the file), never what the
  replay has seen of its session (NOTES.md, "What a policy is fed");
- text (cache_aware only): the block ids as characters, two per block, fed to the same TextTree
  the router keeps; its per-worker bound is sglang-router's 2^26 chars at ~4 chars per token;
- tick: one per decision; entropy: from a random.Random(seed).

The tiers and their costs (tier modes, server links, write-through, HiCache prefetch) are in
sim/tiers.py; each instance reads the global tier through its TierPort, whose time the loop
sets before it calls the engine (the engine has no clock). An instance whose only work is
requests waiting on their prefetch is parked until the first may stop, or the next arrival.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from smetric_router.cluster.text_tree import TextTree
from smetric_router.core.decay import RECENT_HALF_LIFE_S, DecayingSum
from smetric_router.core.types import ClusterView, RequestFeatures, WorkerView
from smetric_router.engine.api import EngineRequest, StepResult
from smetric_router.engine.engine import Engine
from smetric_router.engine.timing import TimingModel
from smetric_router.policies.base import Policy
from smetric_router.policies.follow_up_priority import follow_up_priority
from smetric_router.sim.admission import RouterGate
from smetric_router.sim.collect import with_rare_collections
from smetric_router.sim.config import SimConfig
from smetric_router.sim.pages import PageMapper
from smetric_router.sim.tiers import HiCachePrefetch, TierPort, Tiers, engine_setup, prefetch_wake
from smetric_router.traces.schema import TraceRequest

_CHARS_PER_TOKEN = 4  # sglang-router's tree holds text; its size bound is in chars
_TREE_CHARS = 2**26


@dataclass(slots=True)
class RequestRecord:
    """One request's fate (times in virtual seconds; -1 = never happened)."""

    arrival: float
    input_len: int
    output_len: int
    turn: int
    instance: int
    first_instance: int  # the instance its session's first request went to (-1: not in trace)
    cached_local: int = 0  # prompt tokens from the GPU or host tier
    cached_global: int = 0  # prompt tokens fetched from the global tier
    first_token: float = -1.0
    finish: float = -1.0
    trace_index: int = -1  # its request's index in the trace
    router_wait: float = 0.0  # how long the router's admission held it before placing it
    # the router's admission refused it after its queue timeout (never placed: instance -1)
    refused: bool = False


__all__ = ["Cluster", "RequestRecord", "RunResult", "add_to_windows", "engine_setup", "simulate"]


@dataclass(slots=True)
class RunResult:
    records: list[RequestRecord]
    window_tokens: list[list[float]]  # [window][instance] tokens computed (prefill + decode)
    window_s: float
    tier_mode: str = "paper"
    link_busy_s: tuple[float, ...] = ()  # per server: seconds its link was busy
    global_fetch_bytes: float = 0.0  # KV bytes read from the global tier (whole pages)
    global_write_bytes: float = 0.0  # KV bytes written through to it
    kept_slot_claims: int = 0  # follow-ups that took a slot kept for them (queue_session_grace_s)

    @property
    def longest_router_wait_s(self) -> float:
        """The router's admission (SimConfig.max_concurrent_requests): the longest a request
        waited there before it was placed (its record's first_token - arrival includes it)."""
        return max((r.router_wait for r in self.records), default=0.0)


class SimInstance:
    """An engine on the virtual clock: what the colocated and the PD cluster's loops share."""

    __slots__ = (
        "busy",
        "clock",
        "engine",
        "idx",
        "parked",
        "port",
        "prefetch",
        "result",
        "version",
    )

    def __init__(
        self, idx: int, engine: Engine, port: TierPort | None, prefetch: HiCachePrefetch | None
    ) -> None:
        self.idx = idx
        self.engine = engine
        self.port = port  # its view of the global tier (None: no tier)
        self.prefetch = prefetch  # hicache mode: its L3 prefetches
        self.parked = False  # idle but for requests waiting on their prefetch
        self.clock = 0.0  # start of the step (or run) in flight, or of the next one
        self.busy = False  # an event is scheduled for it
        self.result: StepResult | None = None  # the single step in flight, delivered at its end
        self.version = 0


class _Instance(SimInstance):
    __slots__ = ("plan_k", "plan_start")

    def __init__(
        self, idx: int, engine: Engine, port: TierPort | None, prefetch: HiCachePrefetch | None
    ) -> None:
        super().__init__(idx, engine, port, prefetch)
        self.plan_k = 0  # the pure-decode run in flight (steps), started at plan_start
        self.plan_start = 0.0


def _block_text(block_ids: Sequence[int]) -> str:
    return "".join(chr(0x4000 + (b >> 14 & 0x3FFF)) + chr(0x4000 + (b & 0x3FFF)) for b in block_ids)


def arrival_order(trace: Sequence[TraceRequest]) -> list[int]:
    return sorted(range(len(trace)), key=lambda i: (trace[i].arrival_s, i))


def add_to_windows(
    windows: list[list[float]],
    instances: int,
    window_s: float,
    idx: int,
    start: float,
    end: float,
    tokens: float,
) -> None:
    """Spread instance idx's tokens computed over [start, end) across windows of window_s
    ([window][instance], grown as needed): the colocated and the PD cluster's series."""
    if tokens <= 0:
        return
    if end <= start:
        end = start + 1e-12
    first, last = int(start // window_s), int(end // window_s)
    while len(windows) <= last:
        windows.append([0.0] * instances)
    if first == last:
        windows[first][idx] += tokens
        return
    rate = tokens / (end - start)
    for k in range(first, last + 1):
        lo, hi = max(start, k * window_s), min(end, (k + 1) * window_s)
        windows[k][idx] += rate * (hi - lo)


def router_features(
    req: TraceRequest,
    prompt_pages: list[int],
    page_size: int,
    text: str = "",
    session_hint: bool = False,
) -> RequestFeatures:
    """The features the router would compute for a trace request, from the request alone (never
    from what the replay has seen): turn and est_hit as the router reads them off the history
    the request carries (TraceRequest.router_turn / history_len); session_hint: the trace's
    session id as the agent's session header (SimConfig.session_hints)."""
    return RequestFeatures(
        prompt_len=req.input_len,
        page_hashes=prompt_pages,
        page_size=page_size,
        turn=req.router_turn,
        est_hit=min(req.history_len, req.input_len),
        text=text,
        session_hint=req.session if session_hint else None,
    )


class _Followers:
    """The requests whose parent is in the trace, released when the parent's reply ends
    (SimConfig.follow_ups). A parent later in the trace than its child is not waited for: the
    child could never arrive."""

    def __init__(
        self, trace: Sequence[TraceRequest], at: list[float], rank: list[int], mode: str
    ) -> None:
        index = {req.req_id: i for i, req in enumerate(trace)}
        self.at, self.rank, self.on_reply = at, rank, mode == "on-reply"
        self.root = [True] * len(trace)
        self.children: list[list[int]] = [[] for _ in trace]
        for i, req in enumerate(trace):
            p = index.get(req.parent) if req.parent is not None else None
            if p is not None and p != i and rank[p] < rank[i]:
                self.children[p].append(i)
                self.root[i] = False

    def release(self, parent: int, t: float, pending: list[tuple[float, int, int]]) -> None:
        for i in self.children[parent]:
            arrive = t if self.on_reply else max(t, self.at[i])
            heapq.heappush(pending, (arrive, self.rank[i], i))


class Cluster:
    def __init__(
        self,
        cfg: SimConfig,
        policy: Policy,
        global_ratio: float,
        timing: TimingModel | None = None,
    ) -> None:
        self.cfg = cfg
        self.policy = policy
        self.timing = timing or TimingModel.load(cfg.profile)
        self.tiers = Tiers(cfg, self.timing, global_ratio)
        self.global_tier = self.tiers.tier
        self.instances: list[_Instance] = []
        for i in range(cfg.instances):
            eng = self.tiers.engine(i)
            self.instances.append(_Instance(i, eng, self.tiers.port(i), self.tiers.prefetcher(i)))
        self.urls = [f"sim-{i}" for i in range(cfg.instances)]
        self._url_index = {u: i for i, u in enumerate(self.urls)}
        self.text_tree: TextTree | None = None
        self._heap: list[tuple[float, int, int, int]] = []
        self._seq = 0
        self._load = [0] * cfg.instances
        self._unprefilled = [0] * cfg.instances
        self._recent = [DecayingSum(RECENT_HALF_LIFE_S) for _ in range(cfg.instances)]
        self._share: dict[int, int] = {}  # request -> its new tokens, until its first token
        self._records: list[RequestRecord] = []
        self._windows: list[list[float]] = []
        self._pending: list[tuple[float, int, int]] = []  # arrivals to come
        self._follow: _Followers | None = None
        cap = cfg.max_concurrent_requests
        self._gate = (
            RouterGate(
                cap, cfg.queue_first_turn_ceiling_s, cfg.queue_session_grace_s, cfg.queue_timeout_s
            )
            if cap > 0
            else None
        )
        self._keys: dict[int, int] = {}  # request in flight -> its prompt's last full page hash
        self._session_first: dict[str, int] = {}
        self._trace: Sequence[TraceRequest] = ()
        self._rng = random.Random(cfg.seed)
        self._progress: Callable[[int], None] | None = None

    # ---- events -------------------------------------------------------------------------------

    def _schedule(self, inst: _Instance, t: float) -> None:
        inst.version += 1
        inst.busy = True
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, inst.idx, inst.version))

    def _run_events(self, until: float) -> None:
        heap = self._heap
        pending = self._pending
        while heap and heap[0][0] <= until:
            t, _, idx, version = heapq.heappop(heap)
            inst = self.instances[idx]
            if version != inst.version:
                continue
            if inst.result is not None:
                self._deliver(inst, inst.result, t)
                inst.result = None
                if pending and pending[0][0] < until:
                    until = pending[0][0]  # a follow-up sent on this reply comes first
            if inst.plan_k:
                self._apply_run(inst, inst.plan_k, math.inf)
            self._start_step(inst, t)

    def _start_step(self, inst: _Instance, t: float) -> None:
        inst.clock = t
        inst.parked = False
        eng = inst.engine
        if not eng.has_work():
            inst.busy = False
            return
        port = inst.port
        if port is not None:
            port.now = t
        k = eng.decode_only_steps()
        if k >= 2:
            inst.plan_k, inst.plan_start = k, t
            self._schedule(inst, t + eng.decode_run_seconds(k))
            return
        before = eng.prefill_tokens_computed
        res = eng.step()
        if port is not None:
            port.flush(t, t + res.duration)
        if res.duration == 0 and not res.finished:
            self._park(inst, t)
            return
        for rid, cached in res.scheduled:
            rec = self._records[int(rid)]
            rec.cached_global = cached.storage
            rec.cached_local = cached.device + cached.host
        tokens = eng.prefill_tokens_computed - before + len(res.emitted)
        self._account(inst.idx, t, t + res.duration, tokens)
        inst.result = res
        self._schedule(inst, t + res.duration)

    def _park(self, inst: _Instance, t: float) -> None:
        """Nothing could run: every waiting request waits on its prefetch. Wake up when the
        first may stop (an arrival wakes it earlier: _dispatch)."""
        wake = prefetch_wake(inst.prefetch, t, inst.idx)
        inst.parked = True
        self._schedule(inst, wake)

    def _apply_run(self, inst: _Instance, k: int, until_seconds: float) -> None:
        """Apply (part of) the planned pure-decode run; the instance's clock moves to its end."""
        res = inst.engine.step_many(k, until_seconds)
        end = inst.plan_start + res.duration
        self._account(inst.idx, inst.plan_start, end, sum(n for _, n in res.emitted))
        inst.plan_k = 0
        inst.clock = end

    def _deliver(self, inst: _Instance, res: StepResult, t: float) -> None:
        records = self._records
        for rid, _ in res.emitted:
            rec = records[int(rid)]
            if rec.first_token < 0:
                rec.first_token = t
                self._unprefilled[inst.idx] -= self._share.pop(int(rid))
        gate = self._gate
        for rid in res.finished:
            records[int(rid)].finish = t
            self._load[inst.idx] -= 1
            if gate is not None:  # a kept slot stays taken until claimed or expired
                gate.keep(t, self._keys.pop(int(rid), None))
            if self._follow is not None:
                self._follow.release(records[int(rid)].trace_index, t, self._pending)
        if res.finished:
            self._admit(t)  # before the follow-ups just released arrive, as in the router

    def _account(self, idx: int, start: float, end: float, tokens: float) -> None:
        add_to_windows(
            self._windows, self.cfg.instances, self.cfg.window_s, idx, start, end, tokens
        )

    # ---- arrivals -----------------------------------------------------------------------------

    @with_rare_collections
    def run(
        self,
        trace: Sequence[TraceRequest],
        rate_scale: float = 1.0,
        progress: Callable[[int], None] | None = None,
    ) -> RunResult:
        if rate_scale <= 0:
            raise ValueError(f"rate_scale must be > 0, got {rate_scale}")
        cfg = self.cfg
        mapper = PageMapper(cfg.page_size)
        order = arrival_order(trace)
        if self.policy.uses_text_tree and trace:
            blocks = _TREE_CHARS // _CHARS_PER_TOKEN // trace[0].block_size
            self.text_tree = TextTree(max_size=2 * max(blocks, 1))  # two chars per block
        t0 = trace[order[0]].arrival_s if order else 0.0
        at = [(req.arrival_s - t0) / rate_scale for req in trace]
        rank = [0] * len(trace)
        for pos, i in enumerate(order):
            rank[i] = pos
        waits = cfg.follow_ups != "trace"
        self._follow = _Followers(trace, at, rank, cfg.follow_ups) if waits else None
        self._trace, self._rng, self._progress = trace, random.Random(cfg.seed), progress
        # (time, position in the trace's order, index): the trace's order breaks ties
        pending = self._pending
        pending[:] = [(at[i], rank[i], i) for i in order if self._follow is None or
                      self._follow.root[i]]  # fmt: skip
        gate = self._gate
        arrived = 0
        while True:
            # a reply may send a follow-up before the next arrival known now, or after the last
            until = pending[0][0] if pending else math.inf
            due = gate.next_timeout() if gate is not None else None
            if due is not None and due <= until:  # the oldest waiting request times out first
                self._run_events(due)
                if not self._refuse(due):  # admitted since, or something comes first
                    self._expire_idle()
                continue
            self._run_events(until)
            if self._expire_idle():
                continue
            if not pending:
                break
            t, _, i = heapq.heappop(pending)
            # pages in arrival order, whenever the request is placed: the mapper follows sessions
            hashes = mapper.pages(trace[i], arrived)
            arrived += 1
            if gate is None:
                self._place(i, hashes, t, t)
                continue
            gate.expire(t)
            follow_up = trace[i].router_turn > 0
            if follow_up and gate.claim(t, hashes[: trace[i].input_len // cfg.page_size]):
                self._place(i, hashes, t, t)  # the kept slot passes to it
            elif gate.queue or self._taken(gate) >= gate.cap:
                gate.wait(t, i, hashes, follow_up)
                self._admit(t)  # slots that expired just now go to the queue, this one included
            else:
                self._place(i, hashes, t, t)
        if gate is not None and gate.queue:
            raise RuntimeError(f"{len(gate.queue)} requests still wait at the router")
        return RunResult(
            self._records,
            self._windows,
            cfg.window_s,
            cfg.tier_mode,
            tuple(link.busy_s for link in self.tiers.links),
            self.tiers.stats.fetch_bytes,
            self.tiers.stats.write_bytes,
            kept_slot_claims=gate.claims if gate is not None else 0,
        )

    def _place(self, i: int, hashes: list[int], arrival: float, t: float) -> None:
        """Decide where trace request i goes and send it there at t (arrival: when its client
        sent it; later than t only for a request the router's admission held back)."""
        cfg = self.cfg
        ps = cfg.page_size
        req = self._trace[i]
        n = len(self._records)
        text = _block_text(req.block_ids) if self.text_tree is not None else ""
        prompt_pages = hashes[: req.input_len // ps]
        features = router_features(req, prompt_pages, ps, text, cfg.session_hints)
        cacheable = prompt_pages[: (req.input_len - 1) // ps]
        idx, hit = self._decide(features, cacheable, n, self._rng, t)
        if req.turn == 0:
            self._session_first[req.session] = idx
        first = self._session_first.get(req.session, -1)
        self._records.append(
            RequestRecord(
                arrival,
                req.input_len,
                req.output_len,
                req.turn,
                idx,
                first,
                trace_index=i,
                router_wait=t - arrival,
            )
        )
        self._load[idx] += 1
        if self._gate is not None and self._gate.kept is not None and req.input_len >= ps:
            self._keys[n] = hashes[req.input_len // ps - 1]
        new = max(req.input_len - hit, 0)
        self._unprefilled[idx] += new
        self._recent[idx].add(new, t)
        self._share[n] = new
        priority = follow_up_priority(req.router_turn, None, cfg.follow_up_priority)
        self._dispatch(
            self.instances[idx],
            EngineRequest(str(n), [], [], hashes, req.input_len, max(req.output_len, 1), priority),
            t,
        )
        if self._progress is not None:
            self._progress(1)

    def _admit(self, t: float) -> None:
        """The router's admission at t, after requests ended: what its order admits into the
        slots they freed (and the kept slots that expired) is placed now, on the cluster as it
        is now."""
        gate = self._gate
        if gate is None:
            return
        gate.expire(t)
        if not gate.queue:
            return
        for i, hashes, arrival in gate.admit(t, gate.cap - self._taken(gate)):
            self._place(i, hashes, arrival, t)

    def _refuse(self, due: float) -> bool:
        """The router's queue timeout at `due`, unless an arrival comes first or requests were
        admitted since (then the oldest waiting one times out later). A refused request is
        never placed; its client goes on with its conversation then."""
        gate = self._gate
        assert gate is not None
        pending = self._pending
        if gate.next_timeout() != due or (pending and pending[0][0] < due):
            return False
        expiry = gate.next_expiry()
        if not self._heap and expiry is not None and expiry < due:
            return False  # nothing runs: the kept slot goes back to the queue first (_expire_idle)
        self._admit(due)  # kept slots whose grace ended go to the queue first
        for i, _, arrival in gate.refuse(due):
            req = self._trace[i]
            first = self._session_first.get(req.session, -1)
            self._records.append(
                RequestRecord(
                    arrival, req.input_len, req.output_len, req.turn, -1, first,
                    trace_index=i, router_wait=due - arrival, refused=True,
                )
            )  # fmt: skip
            if self._follow is not None:
                self._follow.release(i, due, pending)
            if self._progress is not None:
                self._progress(1)
        return True

    def _taken(self, gate: RouterGate) -> int:
        """The slots the router's cap counts: requests placed and not finished, and the slots
        kept for a conversation's next turn."""
        return sum(self._load) + gate.kept_slots()

    def _expire_idle(self) -> bool:
        """Nothing runs and requests wait at the router behind kept slots: the first slot's
        grace ends before the next arrival (which might claim it). True when it admitted."""
        gate = self._gate
        if gate is None or self._heap or not gate.queue:
            return False
        due = gate.next_expiry()
        if due is None or (self._pending and self._pending[0][0] <= due):
            return False
        self._admit(due)
        return True

    def _decide(
        self,
        features: RequestFeatures,
        cacheable: list[int],
        tick: int,
        rng: random.Random,
        now: float,
    ) -> tuple[int, int]:
        """The instance the policy chose and the local hit its view showed there."""
        ps = self.cfg.page_size
        text_match: dict[str, int] = {}
        tree = self.text_tree
        if tree is not None:
            text_match = tree.match(features.text)
        workers = []
        l3 = self.global_tier.readable(cacheable) * ps if self.global_tier is not None else 0
        for i, inst in enumerate(self.instances):
            gpu, host = inst.engine.cache.match_len(cacheable)
            url = self.urls[i]
            workers.append(
                WorkerView(
                    url=url,
                    load=self._load[i],
                    unprefilled=self._unprefilled[i],
                    recent_tokens=self._recent[i].value(now),
                    running=inst.engine.num_running_reqs,
                    hit=(gpu + host) * ps,
                    gpu_hit=gpu * ps,
                    l3_hit=l3,
                    text_match=text_match.get(url, 0),
                    text_tree_size=tree.size(url) if tree is not None else 0,
                )
            )
        view = ClusterView(tuple(workers), tick, rng.getrandbits(64))
        url = self.policy.decide(features, view).worker
        if tree is not None:
            tree.insert(features.text, url)
        idx = self._url_index[url]
        return idx, workers[idx].hit

    def _dispatch(self, inst: _Instance, req: EngineRequest, t: float) -> None:
        if inst.port is not None:
            inst.port.now = t  # a prefetch starts at the arrival
        if inst.parked:
            inst.engine.add_request(req)
            self._schedule(inst, t)  # supersedes the wake-up
        elif inst.plan_k:
            # cut the pure-decode run at the first step boundary at or after t
            self._apply_run(inst, inst.plan_k, t - inst.plan_start)
            inst.engine.add_request(req)
            self._schedule(inst, inst.clock)
        elif inst.busy:
            inst.engine.add_request(req)  # joins at the next step
        else:
            inst.engine.add_request(req)
            self._schedule(inst, t)


def simulate(
    trace: Sequence[TraceRequest],
    policy: Policy,
    cfg: SimConfig,
    rate_scale: float = 1.0,
    global_ratio: float | None = None,
    progress: Callable[[int], None] | None = None,
) -> RunResult:
    """Replay the trace (arrival times divided by rate_scale) through one policy."""
    ratio = cfg.global_ratio if global_ratio is None else global_ratio
    return Cluster(cfg, policy, ratio).run(trace, rate_scale, progress)
