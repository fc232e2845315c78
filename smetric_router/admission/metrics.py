"""smetric_admission_* on the router's Prometheus registry, each with a `tenant` label (the key
file's tenant names, or "anonymous" without one: bounded by the file)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

# Why a request left the queue without being admitted.
QUEUE_FULL = "queue_full"
TIMEOUT = "timeout"
DISPLACED = "displaced"  # a follow-up, or a tenant under its share, took its place
CANCELLED = "cancelled"  # its client went away while it waited
RATE_LIMIT = "rate_limit"  # its tenant was over its requests or tokens per minute

_QUEUED = "smetric_admission_queued"
_QUEUED_HELP = "Requests waiting in the router queue, by tenant"


class _Queued(Collector):
    """The queue's length per tenant, read at scrape time (every known tenant, 0 included)."""

    def __init__(self, tenants: Sequence[str], counts: Callable[[], Mapping[str, int]]) -> None:
        self._tenants = tenants
        self._counts = counts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(_QUEUED, _QUEUED_HELP, labels=["tenant"])
        counts = self._counts()
        for t in self._tenants:
            family.add_metric([t], float(counts.get(t, 0)))
        yield family

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(_QUEUED, _QUEUED_HELP, labels=["tenant"])


class AdmissionMetrics:
    """queued and running exist with the admission queue only (queued/running None without it);
    the counters and the wait histogram also count what the tenants' rate limits let through or
    refuse when there is no queue."""

    def __init__(
        self,
        registry: CollectorRegistry,
        tenants: Sequence[str],
        queued: Callable[[], Mapping[str, int]] | None,
        running: Callable[[], int] | None,
    ) -> None:
        r = registry
        if queued is not None:
            r.register(_Queued(tuple(tenants), queued))
        if running is not None:
            n = Gauge(
                "smetric_admission_running",
                "Requests admitted and not yet answered, and slots kept for a conversation's "
                "next turn (bounded by --max-concurrent-requests)",
                registry=r,
            )
            n.set_function(lambda: float(running()))
        self.admitted = Counter(
            "smetric_admission_admitted",
            "Requests admitted, by kind (follow_up: turn > 0; first_turn), whether they "
            "waited in the queue, and tenant",
            ["kind", "queued", "tenant"],
            registry=r,
        )
        self.shed = Counter(
            "smetric_admission_shed",
            "Requests refused or that left the queue unadmitted, by reason (rate_limit: the "
            "tenant's requests or tokens per minute, queue_full, timeout: HTTP 429; displaced: "
            "a follow-up or a tenant under its share took its place in a full queue, HTTP 429; "
            "cancelled: the client went away), kind and tenant",
            ["reason", "kind", "tenant"],
            registry=r,
        )
        self.session_slots = Counter(
            "smetric_admission_session_slots",
            "Slots kept for a conversation's next turn (--queue-session-grace-secs), by outcome: "
            "kept when a request ended, claimed by the request continuing it, expired unclaimed "
            "(back to the queue)",
            ["outcome"],
            registry=r,
        )
        self.wait = Histogram(
            "smetric_admission_wait_seconds",
            "Time from arrival at the admission check to admission, by kind and tenant",
            ["kind", "tenant"],
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        # every tenant's series from the start, at 0: a rate() over a new series misses its
        # first increase
        for t in tenants:
            for k in ("follow_up", "first_turn"):
                self.wait.labels(k, t)


def kind(follow_up: bool) -> str:
    return "follow_up" if follow_up else "first_turn"
