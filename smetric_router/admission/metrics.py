"""smetric_admission_* on the router's Prometheus registry."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

# Why a request left the queue without being admitted.
QUEUE_FULL = "queue_full"
TIMEOUT = "timeout"
DISPLACED = "displaced"  # a follow-up took its place in a full queue
CANCELLED = "cancelled"  # its client went away while it waited


class AdmissionMetrics:
    def __init__(
        self, registry: CollectorRegistry, queued: Callable[[], int], running: Callable[[], int]
    ) -> None:
        r = registry
        q = Gauge("smetric_admission_queued", "Requests waiting in the router queue", registry=r)
        q.set_function(lambda: float(queued()))
        n = Gauge(
            "smetric_admission_running",
            "Requests admitted and not yet answered (bounded by --max-concurrent-requests)",
            registry=r,
        )
        n.set_function(lambda: float(running()))
        self.admitted = Counter(
            "smetric_admission_admitted",
            "Requests admitted, by kind (follow_up: turn > 0; first_turn) and whether they "
            "waited in the queue",
            ["kind", "queued"],
            registry=r,
        )
        self.shed = Counter(
            "smetric_admission_shed",
            "Requests that left the queue unadmitted, by reason (queue_full, timeout: HTTP 429; "
            "displaced: a follow-up took its place in a full queue, HTTP 429; cancelled: the "
            "client went away)",
            ["reason", "kind"],
            registry=r,
        )
        self.wait = Histogram(
            "smetric_admission_wait_seconds",
            "Time from arrival at the admission check to admission, by kind",
            ["kind"],
            buckets=_WAIT_BUCKETS,
            registry=r,
        )


def kind(follow_up: bool) -> str:
    return "follow_up" if follow_up else "first_turn"
