"""Registration: discovered changes through the registry's add/remove, owning only what it added."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from smetric_router.discovery.base import Added, Discovered, Removed
from smetric_router.discovery.metrics import DiscoveryMetrics
from smetric_router.discovery.register import Registration
from smetric_router.router.workers import Worker, WorkerRejected, WorkerSpec
from tests.helpers.prometheus import total


class FakeRegistry:
    """The registry's add/remove as POST/DELETE /workers see them."""

    def __init__(self, *static: str) -> None:
        self.workers = {u: WorkerSpec(u).make() for u in static}
        self.refuse: set[str] = set()

    async def add(self, spec: WorkerSpec) -> Worker:
        if spec.url in self.workers:
            raise KeyError(spec.url)
        if spec.url in self.refuse:
            raise WorkerRejected(f"worker {spec.url} uses page size 32 but the router uses 16")
        w = self.workers[spec.url] = spec.make()
        w.healthy = True
        return w

    async def remove(self, url: str) -> Worker | None:
        return self.workers.pop(url, None)


def pod(url: str, name: str) -> Discovered:
    return Discovered(WorkerSpec(url), f"pod ns/{name}")


async def test_only_what_discovery_added_is_removed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    static = "http://10.0.0.1:8000"
    registry = FakeRegistry(static)
    prom = CollectorRegistry()
    reg = Registration(registry, DiscoveryMetrics(prom), "kubernetes")
    mine, refused = pod("http://10.0.0.2:8000", "b"), pod("http://10.0.0.3:8000", "c")
    registry.refuse.add(refused.url)
    await reg.apply([Added(pod(static, "a"), "pod_ready"), Added(mine, "pod_ready"),
                     Added(refused, "pod_ready")])  # fmt: skip
    assert set(registry.workers) == {static, mine.url}
    assert set(reg.owned) == {mine.url}
    assert "worker http://10.0.0.2:8000 added by discovery (pod ns/b ready)" in caplog.text
    await reg.apply([Removed(pod(static, "a"), "deleted"), Removed(mine, "not_ready"),
                     Removed(refused, "deleted")])  # fmt: skip
    assert set(registry.workers) == {static}  # the operator's worker stays
    assert "worker http://10.0.0.2:8000 removed by discovery (pod ns/b not ready)" in caplog.text
    text = generate_latest(prom).decode()
    assert total(text, "smetric_discovery_workers_added_total") == 1
    assert total(text, "smetric_discovery_workers_removed_total", reason="not_ready") == 1
    assert total(text, "smetric_discovery_workers_removed_total") == 1
    assert total(text, "smetric_discovery_errors_total", kind="rejected") == 1
    assert total(text, "smetric_discovery_workers", provider="kubernetes") == 0
