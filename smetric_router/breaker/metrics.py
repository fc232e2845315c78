"""smetric_breaker_* on the router's Prometheus registry."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge

from smetric_router.breaker.state import State


class BreakerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.state = Gauge(
            "smetric_breaker_state",
            "Each worker's circuit: 0 closed, 1 half-open (probes only), 2 open (no requests)",
            ["worker"],
            registry=registry,
        )
        self.transitions = Counter(
            "smetric_breaker_transitions",
            "Circuit state changes, by worker and the state entered",
            ["worker", "to"],
            registry=registry,
        )

    def moved(self, worker: str, to: State) -> None:
        self.state.labels(worker).set(int(to))
        self.transitions.labels(worker, to.label).inc()

    def added(self, worker: str) -> None:
        self.state.labels(worker).set(int(State.CLOSED))

    def removed(self, worker: str) -> None:
        # a removed worker's gauge would otherwise stay at its last value forever
        with contextlib.suppress(KeyError):
            self.state.remove(worker)
