"""The one place discovered workers reach the router: each change goes through the registry's
add/remove, the path POST/DELETE /workers take, so a discovered worker gets the same health
checks, metrics, KV-event subscription, and on removal the same drop of its KV index and
in-flight view.

Discovery only ever removes what it added: a worker given with --worker-urls (or POSTed by an
operator) at the same address stays under the operator's hand, and one the registry refused
(a page-size mismatch, a wrong key) is not retried until its source changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry

from smetric_router.discovery.base import Added, Change, Discovered, Provider, Removed
from smetric_router.discovery.file import FileProvider, FileSettings
from smetric_router.discovery.kubernetes import KubernetesProvider, KubeSettings
from smetric_router.discovery.metrics import DiscoveryMetrics
from smetric_router.router.workers import Worker, WorkerRegistry, WorkerSpec

if TYPE_CHECKING:
    from smetric_router.router.config import RouterConfig

log = logging.getLogger(__name__)

Settings = KubeSettings | FileSettings


class Workers(Protocol):
    """What discovery uses of the WorkerRegistry: the admin endpoints' two calls."""

    async def add(self, spec: WorkerSpec) -> Worker: ...

    async def remove(self, url: str) -> Worker | None: ...


class Registration:
    """Applies a provider's changes to the worker registry, in order."""

    def __init__(self, registry: Workers, metrics: DiscoveryMetrics, provider: str) -> None:
        self.registry = registry
        self.metrics = metrics
        self.provider = provider
        self.owned: dict[str, Discovered] = {}

    async def apply(self, changes: Sequence[Change]) -> None:
        for change in changes:
            if isinstance(change, Removed):
                await self._remove(change)
            else:
                await self._add(change)
        self.metrics.owned[self.provider] = len(self.owned)

    async def _remove(self, change: Removed) -> None:
        w = change.worker
        if self.owned.pop(w.url, None) is None:
            return  # never ours: registered by the operator, or refused when it came
        why = change.reason.replace("_", " ")
        if await self.registry.remove(w.url) is None:
            log.info(
                "worker %s already gone when discovery removed it (%s %s)", w.url, w.source, why
            )
        else:
            log.info("worker %s removed by discovery (%s %s)", w.url, w.source, why)
        self.metrics.removed.labels(self.provider, change.reason).inc()

    async def _add(self, change: Added) -> None:
        w = change.worker
        try:
            added = await self.registry.add(w.spec)
        except KeyError:
            log.info(
                "worker %s (%s) is already registered (--worker-urls or POST /workers): "
                "discovery leaves it to the operator", w.url, w.source,
            )  # fmt: skip
            return
        except ValueError as e:  # WorkerRejected, or a spec the registry refuses
            log.error("worker %s (%s) refused: %s", w.url, w.source, e)
            self.metrics.error(self.provider, "rejected")
            return
        self.owned[w.url] = w
        self.metrics.added.labels(self.provider, change.reason).inc()
        state = "ready" if w.source.startswith("pod ") else "listed"
        log.info(
            "worker %s added by discovery (%s %s%s)",
            w.url, w.source, state, "" if added.healthy else "; not answering yet",
        )  # fmt: skip


class Discovery:
    """A provider running in the background, feeding the registry."""

    def __init__(self, provider: Provider, registration: Registration) -> None:
        self.provider = provider
        self.registration = registration
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"discovery-{self.provider.name}")

    async def _run(self) -> None:
        try:
            await self.provider.run(self.registration.apply)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug must not pass silently: the worker list stops following
            log.exception("discovery (%s) stopped; the worker list no longer follows it",
                          self.provider.name)  # fmt: skip
            self.registration.metrics.error(self.provider.name, "stopped")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


async def start_discovery(
    config: RouterConfig, registry: WorkerRegistry, metrics_registry: CollectorRegistry
) -> Discovery | None:
    """The discovery the flags ask for, started; None without one. Raises DiscoveryError (no
    credentials) before anything runs."""
    settings = config.discovery_settings()
    if settings is None:
        return None
    metrics = DiscoveryMetrics(metrics_registry)
    provider: Provider
    if isinstance(settings, KubeSettings):
        provider = await KubernetesProvider.connect(settings, metrics)
    else:
        provider = FileProvider(settings, metrics)
    d = Discovery(provider, Registration(registry, metrics, provider.name))
    d.start()
    return d
