"""An admission gate on a hand-moved clock, with its own metrics registry, for the admission
tests."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from smetric_router.admission.gate import AdmissionConfig, Gate
from smetric_router.admission.metrics import AdmissionMetrics
from smetric_router.admission.room import WorkerRoom
from tests.helpers.clock import FakeClock
from tests.helpers.polling import eventually


def make_gate(
    cap: int | None = 1,
    size: int = 10,
    timeout: float = 30.0,
    rooms: list[WorkerRoom] | None = None,
    max_queued: int = 0,
    grace: float = 0.0,
) -> tuple[Gate, FakeClock, CollectorRegistry]:
    clock = FakeClock()
    registry = CollectorRegistry()
    config = AdmissionConfig(cap, size, timeout, 5.0, max_queued, grace)

    def metrics(g: Gate) -> AdmissionMetrics:
        return AdmissionMetrics(registry, ["anonymous"], g.queued_by_tenant, lambda: g.running)

    return Gate(config, lambda: rooms or [], metrics, clock), clock, registry


async def queued(gate: Gate, n: int) -> None:
    await eventually(lambda: gate.queued == n or None, f"{n} queued")
