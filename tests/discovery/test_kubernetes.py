"""The Kubernetes provider against the stand-in API (tests/helpers/kube_api.py), in process:
credentials from a kubeconfig, list then watch from the list's resourceVersion with bookmarks,
a dropped watch resumed from the last resourceVersion, 410 Gone answered with a re-list, errors
backed off and counted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from smetric_router.discovery.base import Added, Change, DiscoveryError
from smetric_router.discovery.kubernetes import KubernetesProvider, KubeSettings
from smetric_router.discovery.metrics import DiscoveryMetrics
from smetric_router.discovery.pods import PodRules
from smetric_router.discovery.selectors import parse_selector
from tests.helpers.kube_api import KubeApiStandIn
from tests.helpers.polling import eventually
from tests.helpers.prometheus import total

NS = "inference"
APP = {"app": "sglang"}


@dataclass
class Recorder:
    """What a provider asked for: the workers it wants now, and every change in order."""

    workers: dict[str, Change] = field(default_factory=dict)
    log: list[tuple[str, str, str]] = field(default_factory=list)

    async def apply(self, changes: Sequence[Change]) -> None:
        for c in changes:
            if isinstance(c, Added):
                self.workers[c.worker.url] = c
            else:
                self.workers.pop(c.worker.url, None)
            self.log.append(("+" if isinstance(c, Added) else "-", c.worker.url, c.reason))

    def urls(self) -> set[str]:
        return set(self.workers)


@dataclass
class Running:
    api: KubeApiStandIn
    provider: KubernetesProvider
    seen: Recorder
    registry: CollectorRegistry

    def metric(self, name: str, **labels: str) -> float:
        return total(generate_latest(self.registry).decode(), name, **labels)


@pytest.fixture
async def running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Running]:
    api = KubeApiStandIn(bookmark_interval=0.2)
    await api.start()
    monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    registry = CollectorRegistry()
    settings = KubeSettings(
        PodRules(port=8000, selector=parse_selector(["app=sglang"])),
        namespace=NS,
        watch_timeout_secs=30,
        backoff_initial_secs=0.05,
        backoff_max_secs=0.2,
    )
    provider = await KubernetesProvider.connect(settings, DiscoveryMetrics(registry))
    seen = Recorder()
    task = asyncio.create_task(provider.run(seen.apply))
    try:
        yield Running(api, provider, seen, registry)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await api.stop()


async def test_follows_pods_through_list_and_watch(running: Running) -> None:
    api, seen = running.api, running.seen
    api.set_pod(NS, "a", APP, ip="10.0.0.1")
    api.set_pod(NS, "other", {"app": "other"}, ip="10.0.0.9")
    api.set_pod("elsewhere", "b", APP, ip="10.0.0.8")
    await eventually(lambda: seen.urls() == {"http://10.0.0.1:8000"}, "the listed pod")
    (first,) = [q for q in api.requests if q.get("watch") is None]
    assert (
        first["labelSelector"] == "app=sglang" and first["path"] == f"/api/v1/namespaces/{NS}/pods"
    )
    watch = await eventually(api.watch_requests, "a watch")
    # kubernetes_asyncio writes booleans as Python does; the API parses both spellings
    assert watch[0]["allowWatchBookmarks"] in ("true", "True")
    assert watch[0]["resourceVersion"] == "1003"  # the list's
    assert running.metric("smetric_discovery_resyncs_total", reason="start") == 1

    api.set_pod(NS, "b", APP, phase="Pending", ready=False)
    api.set_pod(NS, "b", APP, ip="10.0.0.2", ready=False)
    api.set_pod(NS, "b", APP, ip="10.0.0.2")
    await eventually(lambda: "http://10.0.0.2:8000" in seen.urls(), "b once ready")
    api.set_pod(NS, "b", APP, ip="10.0.0.2", ready=False)
    await eventually(lambda: "http://10.0.0.2:8000" not in seen.urls(), "b not ready")
    api.set_pod(NS, "a", APP, ip="10.0.0.3")
    await eventually(lambda: seen.urls() == {"http://10.0.0.3:8000"}, "a at its new IP")
    api.delete_pod(NS, "a")
    await eventually(lambda: seen.urls() == set(), "a deleted")
    assert seen.log == [
        ("+", "http://10.0.0.1:8000", "pod_ready"),
        ("+", "http://10.0.0.2:8000", "pod_ready"),
        ("-", "http://10.0.0.2:8000", "not_ready"),
        ("-", "http://10.0.0.1:8000", "ip_changed"),
        ("+", "http://10.0.0.3:8000", "pod_ready"),
        ("-", "http://10.0.0.3:8000", "deleted"),
    ]


async def test_dropped_watch_resumes_from_the_last_version_bookmarks_included(
    running: Running,
) -> None:
    api, seen = running.api, running.seen
    api.set_pod(NS, "a", APP, ip="10.0.0.1")
    await eventually(lambda: seen.urls() == {"http://10.0.0.1:8000"}, "a")
    await eventually(api.watch_requests, "a watch")
    # unrelated traffic moves the version on; bookmarks carry it to the client
    api.set_pod("elsewhere", "x", APP, ip="10.0.0.7")
    await eventually(
        lambda: running.provider.resource_version == "1002", "a bookmark at the new version"
    )
    api.drop_watches()
    api.set_pod(NS, "b", APP, ip="10.0.0.2")
    await eventually(lambda: "http://10.0.0.2:8000" in seen.urls(), "b after the drop")
    resumed = api.watch_requests()[-1]
    assert resumed["resourceVersion"] == "1002"  # from the bookmark, not the list's 1001
    assert running.metric("smetric_discovery_watch_restarts_total") >= 1
    assert running.metric("smetric_discovery_resyncs_total") == 1  # no re-list needed


async def test_410_gone_relists_and_removes_pods_deleted_meanwhile(running: Running) -> None:
    api, seen = running.api, running.seen
    api.set_pod(NS, "a", APP, ip="10.0.0.1")
    api.set_pod(NS, "b", APP, ip="10.0.0.2")
    await eventually(lambda: len(seen.urls()) == 2, "a and b")
    await eventually(lambda: api.watches, "an open watch")
    # The watch is cut; while the router is away "a" goes and the history is compacted.
    api.drop_watches()
    api.delete_pod(NS, "a")
    api.compact()
    await eventually(lambda: seen.urls() == {"http://10.0.0.2:8000"}, "a gone after re-list")
    assert ("-", "http://10.0.0.1:8000", "resync") in seen.log
    assert running.metric("smetric_discovery_resyncs_total", reason="gone") == 1
    # and an ERROR 410 on an open watch does the same
    await eventually(lambda: api.watches, "the new watch")
    api.gone_now()
    await eventually(
        lambda: running.metric("smetric_discovery_resyncs_total", reason="gone") == 2,
        "a second re-list",
    )
    api.set_pod(NS, "c", APP, ip="10.0.0.3")
    await eventually(lambda: "http://10.0.0.3:8000" in seen.urls(), "c after the re-list")


async def test_api_errors_are_counted_and_retried(running: Running) -> None:
    api, seen = running.api, running.seen
    await eventually(lambda: api.watches, "an open watch")
    port = api.port
    await api.stop()  # the API server goes away
    await eventually(
        lambda: running.metric("smetric_discovery_errors_total", kind="connection") >= 2,
        "connection errors, retried",
    )
    api.port = port
    api.set_pod(NS, "a", APP, ip="10.0.0.1")
    await api.start()
    await eventually(lambda: seen.urls() == {"http://10.0.0.1:8000"}, "a once the API is back")
    age = total(
        generate_latest(running.registry).decode(), "smetric_discovery_last_event_age_seconds"
    )
    assert 0 <= age < 5


async def test_missing_credentials_fail_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    settings = KubeSettings(PodRules(port=8000, selector=parse_selector(["app=x"])))
    with pytest.raises(DiscoveryError, match="no Kubernetes credentials"):
        await KubernetesProvider.connect(settings, DiscoveryMetrics(CollectorRegistry()))
