"""--service-discovery: list and watch pods through the Kubernetes API (kubernetes_asyncio, an
aiohttp-based client, imported only when discovery is on).

The loop is the API's own list-then-watch protocol: list the pods, note the list's
resourceVersion, watch from it with bookmarks (which advance the resourceVersion while nothing
changes, so a reconnect after a quiet hour is not answered 410), and on a watch that ends or
drops open it again from the last resourceVersion seen. A `410 Gone` (an ERROR event or an HTTP
status) means the history since that version was compacted away: the only safe answer is a new
list, after which pods missing from it are removed. Failures back off exponentially, so an
unreachable API server is not hammered; the workers already registered stay as they are
meanwhile (a router that cannot see the API keeps serving what it knew).

Credentials: in a pod, the service account (KUBERNETES_SERVICE_HOST and its mounted token);
elsewhere the kubeconfig ($KUBECONFIG, else ~/.kube/config).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from smetric_router.discovery.base import Apply, DiscoveryError
from smetric_router.discovery.metrics import DiscoveryMetrics
from smetric_router.discovery.pods import Eligible, PodRules, PodTable, pod_key
from smetric_router.discovery.selectors import LabelSelector, common

log = logging.getLogger(__name__)

SERVICE_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


class ResourceGone(Exception):
    """410 Gone: the resourceVersion watched from is older than the server's history."""


class ApiStatusError(Exception):
    """The API server answered an HTTP error (or an ERROR event) other than 410."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"HTTP {code}: {message}")
        self.code = code


@dataclass(frozen=True, slots=True)
class KubeSettings:
    rules: PodRules
    namespace: str | None = None  # None: all namespaces (needs a ClusterRole)
    # The server ends a watch after this long (jittered by up to a tenth, so that router
    # replicas do not all reconnect at once); bookmarks keep it from going stale before.
    watch_timeout_secs: int = 300
    backoff_initial_secs: float = 0.5
    backoff_max_secs: float = 30.0

    @property
    def list_selector(self) -> LabelSelector:
        """What the API server filters on: the pairs every worker pod carries."""
        r = self.rules
        roles = [s for s in (r.prefill, r.decode) if s is not None]
        return LabelSelector(tuple(sorted(set(r.selector.pairs) | set(common(*roles).pairs))))

    @property
    def where(self) -> str:
        return f"namespace {self.namespace}" if self.namespace else "all namespaces"


class Backoff:
    """Exponential, with jitter; reset once the source answers again."""

    def __init__(self, initial: float, cap: float) -> None:
        self.initial, self.cap = initial, cap
        self._next = initial

    def reset(self) -> None:
        self._next = self.initial

    def next(self) -> float:
        delay, self._next = self._next, min(self.cap, self._next * 2)
        return delay * random.uniform(0.8, 1.2)


def _status_of(body: bytes) -> tuple[int, str]:
    try:
        status = orjson.loads(body)
    except orjson.JSONDecodeError:
        return 0, body[:200].decode(errors="replace")
    if not isinstance(status, dict):
        return 0, ""
    return int(status.get("code") or 0), str(status.get("message") or status.get("reason") or "")


class PodApi:
    """The two calls discovery makes, on raw JSON: the pod table reads the API's objects as
    they come, so nothing is lost or renamed by the client's models."""

    def __init__(self, client: Any, namespace: str | None) -> None:
        from kubernetes_asyncio import client as k8s

        self._client = client
        self._core = k8s.CoreV1Api(client)
        self._namespace = namespace

    @classmethod
    async def connect(cls, namespace: str | None) -> PodApi:
        try:
            from kubernetes_asyncio import client as k8s
            from kubernetes_asyncio import config as k8s_config
        except ImportError as e:
            raise DiscoveryError(
                f"--service-discovery needs the kubernetes_asyncio package ({e})"
            ) from None
        configuration = k8s.Configuration()
        try:
            if os.environ.get("KUBERNETES_SERVICE_HOST") and os.path.exists(SERVICE_TOKEN):
                k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                    client_configuration=configuration
                )
                source = "the pod's service account"
            else:
                path = os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep)[0]
                await k8s_config.load_kube_config(
                    config_file=os.path.expanduser(path),
                    client_configuration=configuration,
                    persist_config=False,
                )
                source = f"kubeconfig {path}"
        except (k8s_config.ConfigException, OSError, ValueError) as e:
            raise DiscoveryError(f"no Kubernetes credentials: {e}") from None
        log.info("discovery: Kubernetes API at %s (from %s)", configuration.host, source)
        return cls(k8s.ApiClient(configuration), namespace)

    async def close(self) -> None:
        await self._client.close()

    async def _call(self, **params: Any) -> aiohttp.ClientResponse:
        params = {k: v for k, v in params.items() if v not in (None, "")}
        if self._namespace:
            resp = await self._core.list_namespaced_pod(
                self._namespace, _preload_content=False, **params
            )
        else:
            resp = await self._core.list_pod_for_all_namespaces(_preload_content=False, **params)
        assert isinstance(resp, aiohttp.ClientResponse)
        if resp.status != 200:
            body = await resp.read()
            resp.release()
            code, message = _status_of(body)
            if resp.status == 410 or code == 410:
                raise ResourceGone(message)
            raise ApiStatusError(resp.status, message or str(resp.reason))
        return resp

    async def list(self, selector: str, timeout: float) -> tuple[list[dict[str, Any]], str]:
        """The pods and the list's resourceVersion."""
        resp = await self._call(
            label_selector=selector, _request_timeout=aiohttp.ClientTimeout(total=timeout)
        )
        async with resp:
            data = orjson.loads(await resp.read())
        items = data.get("items") or []
        rv = str((data.get("metadata") or {}).get("resourceVersion") or "")
        return [p for p in items if isinstance(p, dict)], rv

    async def watch(
        self, selector: str, resource_version: str, timeout_secs: int
    ) -> AsyncIterator[dict[str, Any]]:
        """Watch events from resource_version until the server ends the stream."""
        resp = await self._call(
            label_selector=selector,
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout_secs,
            # The server ends the watch itself; a read silent well past that is a dead link.
            _request_timeout=aiohttp.ClientTimeout(total=None, sock_read=timeout_secs + 30),
        )
        async with resp:
            pending = b""
            async for chunk in resp.content.iter_any():
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        event = orjson.loads(line)
                        if isinstance(event, dict):
                            yield event


def _resource_version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class KubernetesProvider:
    name = "kubernetes"

    def __init__(self, settings: KubeSettings, metrics: DiscoveryMetrics, api: PodApi) -> None:
        self.settings = settings
        self.metrics = metrics
        self.api = api
        self.table = PodTable(settings.rules)
        # Where the next watch starts; None: list first.
        self.resource_version: str | None = None
        self._listed_at = 0.0

    @classmethod
    async def connect(cls, settings: KubeSettings, metrics: DiscoveryMetrics) -> KubernetesProvider:
        return cls(settings, metrics, await PodApi.connect(settings.namespace))

    async def run(self, apply: Apply) -> None:
        s = self.settings
        selector = s.list_selector.query()
        log.info(
            "discovery: watching pods in %s with selector %s (port %d)",
            s.where, s.list_selector, s.rules.port,
        )  # fmt: skip
        backoff = Backoff(s.backoff_initial_secs, s.backoff_max_secs)
        relist_reason = "start"
        try:
            while True:
                try:
                    if self.resource_version is None:
                        await self._list(apply, selector, relist_reason)
                        backoff.reset()
                    await self._watch(apply, selector, backoff)
                    self.metrics.watch_restarts.labels(self.name).inc()
                except ResourceGone as e:
                    log.info("discovery: watch history gone (410: %s); listing pods again", e)
                    self.resource_version, relist_reason = None, "gone"
                    self.metrics.watch_restarts.labels(self.name).inc()
                    if time.monotonic() - self._listed_at < 1.0:
                        # gone again right after a list: a server that cannot serve its own
                        # list's version must not be re-listed in a tight loop
                        await asyncio.sleep(backoff.next())
                except (ApiStatusError, aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
                    # ValueError: an undecodable list or event, the API's fault as much
                    kind = "connection" if isinstance(e, aiohttp.ClientError) else "api"
                    self.metrics.error(self.name, kind)
                    listing = self.resource_version is None
                    if listing:
                        relist_reason = "error"
                    else:
                        self.metrics.watch_restarts.labels(self.name).inc()
                    delay = backoff.next()
                    log.warning(
                        "discovery: Kubernetes API %s failed (%s); again in %.1f s",
                        "list" if listing else "watch", e or type(e).__name__, delay,
                    )  # fmt: skip
                    await asyncio.sleep(delay)
        finally:
            await self.api.close()

    async def _list(self, apply: Apply, selector: str, reason: str) -> None:
        pods, rv = await self.api.list(selector, timeout=60.0)
        self.metrics.resyncs.labels(self.name, reason).inc()
        self.metrics.saw_event(self.name)
        await apply(self.table.replace(pods))
        ready = sum(isinstance(self.table.decision(pod_key(p)), Eligible) for p in pods)
        log.info(
            "discovery: listed %d pods (%d ready workers) at resourceVersion %s",
            len(pods), ready, rv,
        )  # fmt: skip
        self.resource_version = rv
        self._listed_at = time.monotonic()

    async def _watch(self, apply: Apply, selector: str, backoff: Backoff) -> None:
        """Follow one watch to its end, keeping the resourceVersion to go on from (also when
        the watch breaks off)."""
        rv = self.resource_version
        assert rv is not None
        jitter = random.uniform(1.0, 1.1)
        started = time.monotonic()
        events = 0
        async for event in self.api.watch(
            selector, rv, int(self.settings.watch_timeout_secs * jitter)
        ):
            kind = event.get("type")
            obj = event.get("object")
            if not isinstance(obj, dict):
                raise ValueError(f"watch event without an object: {str(event)[:200]}")
            if kind == "ERROR":
                code = int(obj.get("code") or 0)
                if code == 410:
                    raise ResourceGone(str(obj.get("message") or "too old resource version"))
                raise ApiStatusError(code, str(obj.get("message") or obj.get("reason") or ""))
            events += 1
            backoff.reset()
            self.metrics.saw_event(self.name)
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                await apply(self.table.apply(kind, obj))
            elif kind != "BOOKMARK":
                log.debug("discovery: ignoring watch event of type %r", kind)
            # only once applied: a watch cut during apply resumes before this event
            self.resource_version = _resource_version(obj) or self.resource_version
        if not events and time.monotonic() - started < 1.0:
            # a server ending watches at once: pace the reconnects as after an error
            await asyncio.sleep(backoff.next())
