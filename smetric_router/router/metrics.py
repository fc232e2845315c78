"""Prometheus metrics on the router's own registry.

Counters and histograms are updated on the request path; per-worker gauges (health, in-flight,
load, KV-feed state) are read from live state at scrape time, so the hot path touches plain ints.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

_M = TypeVar("_M", Counter, Histogram)

# smetric_requests_total's status for a stream cut after its 200 head went out (its worker lost or
# stalled mid-stream): an error, not the 200 the client saw first.
STREAM_ERROR = "stream_error"

_DECISION_BUCKETS = (1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


@dataclass(frozen=True, slots=True)
class WorkerSample:
    url: str
    healthy: bool
    inflight: int
    load: float
    kv_connected: bool | None = None  # None: no KV-event feed for this worker
    kv_resets: int = 0
    kv_gaps_recovered: int = 0
    kv_decode_errors: int = 0
    kv_stalls: int = 0
    inflight_pages: int | None = None  # None: no in-flight prefix view (or a decode worker)
    unprefilled: int | None = None  # None: a PD instance (its load is counted in tokens)
    recent_tokens: float | None = None  # None: a decode instance (the router sends it no prompt)


class _WorkerCollector(Collector):
    def __init__(self, sample: Callable[[], Iterable[WorkerSample]]) -> None:
        self._sample = sample

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        healthy = GaugeMetricFamily(
            "smetric_worker_healthy", "1 when the worker passes health checks", labels=["worker"]
        )
        inflight = GaugeMetricFamily(
            "smetric_worker_inflight", "Requests the router has in flight", labels=["worker"]
        )
        load = GaugeMetricFamily(
            "smetric_worker_load", "Load the policy sees for the worker", labels=["worker"]
        )
        connected = GaugeMetricFamily(
            "smetric_kv_event_connected",
            "1 while the KV-event feed is connected",
            labels=["worker"],
        )
        resets = CounterMetricFamily(
            "smetric_kv_event_resets",
            "Times the worker's KV index was cleared: an unrecoverable event gap, a restart, an "
            "undecodable batch",
            labels=["worker"],
        )
        gaps = CounterMetricFamily(
            "smetric_kv_event_gaps_recovered",
            "Event gaps recovered through the replay socket",
            labels=["worker"],
        )
        decode_errors = CounterMetricFamily(
            "smetric_kv_event_decode_errors",
            "KV-event batches that did not decode (a foreign schema or garbage); each cleared "
            "the worker's KV index",
            labels=["worker"],
        )
        stalls = CounterMetricFamily(
            "smetric_kv_event_stalls",
            "KV-event feeds found stalled (the replay socket had batches the live stream never "
            "delivered, or did not answer): each cleared the worker's KV index and re-synced it",
            labels=["worker"],
        )
        pending = GaugeMetricFamily(
            "smetric_inflight_prefix_pages",
            "Distinct pages of requests in flight to the worker (or just ended) that the "
            "router counts as held there before their KV events arrive",
            labels=["worker"],
        )
        unprefilled = GaugeMetricFamily(
            "smetric_worker_unprefilled_tokens",
            "Colocated worker: prompt tokens routed there and not yet prefilled (no first token "
            "back), as smetric-ftwork sees them: this router's, its syncing replicas', and what "
            "the worker reports waiting beyond those",
            labels=["worker"],
        )
        recent = GaugeMetricFamily(
            "smetric_worker_recent_tokens",
            "New prompt tokens routed to the worker lately, halving every 5 minutes, as "
            "smetric-ftrecent sees them: this router's and its syncing replicas'",
            labels=["worker"],
        )
        for s in self._sample():
            healthy.add_metric([s.url], 1.0 if s.healthy else 0.0)
            inflight.add_metric([s.url], s.inflight)
            load.add_metric([s.url], s.load)
            if s.kv_connected is not None:
                connected.add_metric([s.url], 1.0 if s.kv_connected else 0.0)
                resets.add_metric([s.url], s.kv_resets)
                gaps.add_metric([s.url], s.kv_gaps_recovered)
                decode_errors.add_metric([s.url], s.kv_decode_errors)
                stalls.add_metric([s.url], s.kv_stalls)
            if s.inflight_pages is not None:
                pending.add_metric([s.url], s.inflight_pages)
            if s.unprefilled is not None:
                unprefilled.add_metric([s.url], s.unprefilled)
            if s.recent_tokens is not None:
                recent.add_metric([s.url], s.recent_tokens)
        gauges = [healthy, inflight, load, unprefilled, recent, connected, pending]
        return [*gauges, resets, gaps, decode_errors, stalls]


@dataclass(frozen=True, slots=True)
class L3Sample:
    source: str  # master | events
    ok: bool  # the global tier's state is known
    lookups: dict[str, int]
    outages: int
    resets: int
    keys: int | None  # the master's key count (master source)
    pages: int | None  # pages the events put in L3 (events source)
    queries: int = 0
    query_keys: int = 0
    query_seconds: float = 0.0


class _L3Collector(Collector):
    def __init__(self, sample: Callable[[], L3Sample | None]) -> None:
        self._sample = sample

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        s = self._sample()
        if s is None:
            return []
        src = [s.source]
        state = GaugeMetricFamily(
            "smetric_l3_known",
            "1 while the global tier's (Mooncake's) state is known; 0 = unreachable or "
            "restarting: L3 hits are 'unknown', not misses",
            labels=["source"],
        )
        state.add_metric(src, 1.0 if s.ok else 0.0)
        lookups = CounterMetricFamily(
            "smetric_l3_lookups",
            "L3 lookups by outcome (hit, miss, unknown: state unknown, timeout: over "
            "--l3-budget-secs)",
            labels=["source", "outcome"],
        )
        for outcome, n in sorted(s.lookups.items()):
            lookups.add_metric([s.source, outcome], n)
        out: list[GaugeMetricFamily | CounterMetricFamily] = [state, lookups]
        counters: list[tuple[str, str, float]] = [
            ("outages", "Times the Mooncake master became unreachable", s.outages),
            ("resets", "Times the router's L3 view was dropped (master back after an outage, "
                       "or restarted)", s.resets),
        ]  # fmt: skip
        if s.queries:
            counters += [
                ("master_queries", "Questions put to the Mooncake master (the pages of a prompt "
                                   "not already seen in L3)", s.queries),
                ("master_query_keys", "Keys asked for", s.query_keys),
                ("master_query_seconds", "Time the master took to answer them (late answers "
                                         "included): the L3 view's cost", s.query_seconds),
            ]  # fmt: skip
        for name, doc, value in counters:
            c = CounterMetricFamily(f"smetric_l3_{name}", doc, labels=["source"])
            c.add_metric(src, value)
            out.append(c)
        gauges = [
            ("master_keys", "Objects in the Mooncake store (master's key count)", s.keys),
            ("event_pages", "Pages the workers' L3 events put in the store", s.pages),
        ]
        for name, doc, level in gauges:
            if level is not None:
                g = GaugeMetricFamily(f"smetric_l3_{name}", doc, labels=["source"])
                g.add_metric(src, level)
                out.append(g)
        return out


class RouterMetrics:
    def __init__(
        self,
        sample_workers: Callable[[], Iterable[WorkerSample]],
        sample_l3: Callable[[], L3Sample | None] | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "smetric_requests",
            "Requests answered, by HTTP status; stream_error: a stream cut after its head (worker "
            "lost or stalled mid-stream, ended with an SSE error event)",
            ["endpoint", "status"],
            registry=r,
        )
        self.decisions = Counter(
            "smetric_decisions", "Routing decisions", ["reason", "worker"], registry=r
        )
        # Per API, what the policy made of its requests (Claude Code's Messages, Codex's
        # Responses, chat...): first decision per request, retries not counted again.
        self.endpoint_decisions = Counter(
            "smetric_endpoint_decisions",
            "Requests routed, by endpoint and by the reason of their first routing decision",
            ["endpoint", "reason"],
            registry=r,
        )
        self.retries = Counter(
            "smetric_retries",
            "Dispatches retried away from a failing worker",
            ["worker"],
            registry=r,
        )
        self.stream_errors = Counter(
            "smetric_stream_errors",
            "Streams cut by a lost or stalled worker",
            ["worker"],
            registry=r,
        )
        self.probe_failures = Counter(
            "smetric_probe_failures",
            "Cache probes (--cache-view probe) that timed out or failed; counted as hit 0",
            ["worker", "outcome"],
            registry=r,
        )
        self.duration = Histogram(
            "smetric_request_duration_seconds",
            "Time from request arrival to the end of the response",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "smetric_ttft_seconds",
            "Time from request arrival to the worker's first response byte",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.decide_seconds = Histogram(
            "smetric_decision_seconds",
            "Request arrival to decision: body read, features, view, decide",
            buckets=_DECISION_BUCKETS,
            registry=r,
        )
        # Where a slow decision spends its time: waiting to be read, tokenizing, asking the
        # global tier, deciding. Their sum is smetric_decision_seconds.
        self.decide_stages = Histogram(
            "smetric_decision_stage_seconds",
            "Request arrival to decision by stage: body (reading and parsing it), features "
            "(rendering and tokenizing the prompt, queueing for it included), cache_view "
            "(--cache-view probe), l3 (--l3-view lookup), decide (view and policy)",
            ["stage"],
            buckets=_DECISION_BUCKETS,
            registry=r,
        )
        self.prefix_tokens = Counter(
            "smetric_routed_prefix_tokens",
            "Cached prompt tokens on the chosen worker by the tier that holds them (gpu, host: "
            "its local tiers; l3: loadable from the global tier beyond them; l3_unknown: "
            "decisions made while the global tier's state was unknown, counted once each)",
            ["tier"],
            registry=r,
        )
        self.inflight_raised = Counter(
            "smetric_inflight_prefix_views",
            "Decisions whose view credited some worker with more of the prompt than its KV "
            "events show, from requests in flight to it (--no-inflight-prefixes turns this off)",
            registry=r,
        )
        self.anthropic_dropped = Counter(
            "smetric_anthropic_dropped",
            "Anthropic Messages fields the router removed before forwarding because no worker "
            "of the model has a reasoning parser (--anthropic-thinking drop): thinking, and "
            "context_management.edits (clear_thinking edits, one per edit)",
            ["field"],
            registry=r,
        )
        self.loop_lag = Gauge(
            "smetric_router_event_loop_lag_seconds",
            "How late the router's once-a-second timer last fired: the event loop's lag. A router "
            "busy past its CPU answers everything this much later",
            registry=r,
        )
        # Plain cumulative counts beside the counters above, for the /dashboard sampler
        # (router/dashboard.py): decisions by reason, routed prefix tokens by tier.
        self.decision_counts: dict[str, int] = {}
        self.tier_counts: dict[str, int] = {}
        # children by (metric, label values), kept for the request path (see _child)
        self._children: dict[tuple[object, tuple[str, ...]], Any] = {}
        r.register(_WorkerCollector(sample_workers))
        if sample_l3 is not None:
            r.register(_L3Collector(sample_l3))

    def count_prefix(self, gpu: int, local: int, l3: int | None) -> None:
        """Once per decision: the chosen worker's cached prefix by tier."""
        if gpu:
            self._tier("gpu", gpu).inc(gpu)
        if local > gpu:
            self._tier("host", local - gpu).inc(local - gpu)
        if l3 is None:
            self._tier("l3_unknown").inc()
        elif l3 > local:
            self._tier("l3", l3 - local).inc(l3 - local)

    def _tier(self, tier: str, n: int = 1) -> Counter:
        self.tier_counts[tier] = self.tier_counts.get(tier, 0) + n
        return self._child(self.prefix_tokens, tier)

    def _child(self, metric: _M, *labels: str) -> _M:
        # .labels() hashes and locks on every call; the request path keeps the children instead
        key = (metric, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return cast(_M, child)

    def decided(self, reason: str, worker: str) -> None:
        self.decision_counts[reason] = self.decision_counts.get(reason, 0) + 1
        self._child(self.decisions, reason, worker).inc()

    def routed(self, endpoint: str, reason: str) -> None:
        """Once per generation request, when its first decision is made."""
        self._child(self.endpoint_decisions, endpoint, reason).inc()

    def answered(self, endpoint: str, status: int | str, seconds: float) -> None:
        """Once per generation request, when its response is done."""
        self._child(self.requests, endpoint, str(status)).inc()
        self._child(self.duration, endpoint).observe(seconds)

    def dropped(self, fields: Iterable[str]) -> None:
        for f in fields:
            self._child(self.anthropic_dropped, f).inc()

    def stage(self, name: str, seconds: float) -> None:
        self._child(self.decide_stages, name).observe(seconds)

    def first_byte(self, endpoint: str, seconds: float) -> None:
        self._child(self.ttft, endpoint).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
