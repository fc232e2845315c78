"""smetric_discovery_*: what discovery did to the worker list and how its source is doing.

The counters live on the router's own registry, so they come out of its /metrics with the rest.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector


class _Levels(Collector):
    """Gauges read at scrape time: how old the source's last word is, how many workers it owns."""

    def __init__(self, metrics: DiscoveryMetrics) -> None:
        self._m = metrics

    def collect(self) -> Iterable[GaugeMetricFamily]:
        age = GaugeMetricFamily(
            "smetric_discovery_last_event_age_seconds",
            "Seconds since the source last said anything (a watch event or bookmark, a list, a "
            "read of the file); grows while the source is unreachable",
            labels=["provider"],
        )
        owned = GaugeMetricFamily(
            "smetric_discovery_workers",
            "Workers registered by discovery now",
            labels=["provider"],
        )
        now = time.monotonic()
        for provider, at in self._m.last_event.items():
            age.add_metric([provider], now - at)
        for provider, n in self._m.owned.items():
            owned.add_metric([provider], n)
        return [age, owned]


class DiscoveryMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.added = Counter(
            "smetric_discovery_workers_added",
            "Workers discovery registered, by why (pod_ready, file_entry)",
            ["provider", "reason"],
            registry=registry,
        )
        self.removed = Counter(
            "smetric_discovery_workers_removed",
            "Workers discovery removed, by why (deleted, not_ready, not_running, terminating, "
            "ip_changed, not_selected, resync: gone from a re-list, file_removed, file_changed)",
            ["provider", "reason"],
            registry=registry,
        )
        self.watch_restarts = Counter(
            "smetric_discovery_watch_restarts",
            "Watches opened again after one ended (server timeout, dropped connection, error)",
            ["provider"],
            registry=registry,
        )
        self.resyncs = Counter(
            "smetric_discovery_resyncs",
            "Full re-lists of the source, by why (start; gone: the API answered 410 Gone to a "
            "too-old resourceVersion; error: a list after a failed one)",
            ["provider", "reason"],
            registry=registry,
        )
        self.errors = Counter(
            "smetric_discovery_errors",
            "Failures talking to the source or applying what it said (api: an HTTP error from "
            "the API server; connection; rejected: the registry refused a worker; parse; "
            "unreadable)",
            ["provider", "kind"],
            registry=registry,
        )
        self.last_event: dict[str, float] = {}
        self.owned: dict[str, int] = {}
        registry.register(_Levels(self))

    def saw_event(self, provider: str) -> None:
        self.last_event[provider] = time.monotonic()

    def error(self, provider: str, kind: str) -> None:
        self.errors.labels(provider, kind).inc()
