"""The worker registry: membership, health, reported load and the router's own in-flight counts.

Load rule (what policies see as WorkerView.load): router in-flight + others, where others =
max(0, reported - router in-flight when the report arrived) and reported = num_running_reqs +
num_waiting_reqs summed over DP ranks. The router's count is exact for its own dispatches and never
stale; the report lags by up to one poll but also covers requests sent by other router replicas.
Only that foreign share is taken from the report, so a request of ours that just finished stops
counting at once instead of lingering until the next poll. A report older than three poll intervals
(or from a failed poll) is ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

log = logging.getLogger(__name__)

_STALE_POLLS = 3


class PageSizeMismatch(ValueError):
    pass


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"worker url must look like http://host:port, got {url!r}")
    return url


@dataclass(slots=True, eq=False)
class Worker:
    url: str
    healthy: bool = False
    inflight: int = 0
    reported_load: float | None = None
    reported_at: float = 0.0
    inflight_at_report: int = 0
    page_size: int | None = None
    models: frozenset[str] = frozenset()
    problem: str | None = None  # why the worker is excluded although it answers, if it is
    probed: bool = False

    def load(self, now: float, max_age: float) -> float:
        if self.reported_load is None or now - self.reported_at > max_age:
            return float(self.inflight)
        return self.inflight + max(0.0, self.reported_load - self.inflight_at_report)

    def describe(self, now: float, max_age: float) -> dict[str, Any]:
        return {
            "url": self.url,
            "healthy": self.healthy,
            "inflight": self.inflight,
            "load": self.load(now, max_age),
            "reported_load": self.reported_load,
            "page_size": self.page_size,
            "models": sorted(self.models),
            "problem": self.problem,
        }


def page_size_of(server_info: dict[str, Any]) -> int | None:
    """The page size KV-event hashes use: kv_events.block_size, else the server's page_size."""
    kv = server_info.get("kv_events")
    if isinstance(kv, dict) and isinstance(kv.get("block_size"), int):
        return int(kv["block_size"])
    size = server_info.get("page_size")
    return size if isinstance(size, int) and size > 0 else None


def models_of(v1_models: Any, model_info: Any) -> frozenset[str]:
    names: set[str] = set()
    if isinstance(v1_models, dict):
        for m in v1_models.get("data") or ():
            if isinstance(m, dict) and isinstance(m.get("id"), str):
                names.add(m["id"])
    if isinstance(model_info, dict):
        for key in ("served_model_name", "model_path"):
            if isinstance(model_info.get(key), str):
                names.add(model_info[key])
    return frozenset(names)


Hook = Callable[[str], Awaitable[None]]


@dataclass(slots=True)
class WorkerRegistry:
    session: aiohttp.ClientSession
    page_size: int | None = None  # fixed by --page-size, else by the first worker that reports one
    health_interval: float = 5.0
    health_timeout: float = 5.0
    load_interval: float = 1.0
    on_added: Hook | None = None
    on_removed: Hook | None = None
    workers: dict[str, Worker] = field(default_factory=dict)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def max_load_age(self) -> float:
        return _STALE_POLLS * self.load_interval

    def healthy(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.healthy]

    def models(self) -> frozenset[str]:
        return frozenset().union(*(w.models for w in self.workers.values()))

    def describe(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [w.describe(now, self.max_load_age) for w in self.workers.values()]

    async def initialize(self, urls: Iterable[str]) -> None:
        """Register the start-up workers; those reachable now must agree on the page size."""
        workers = [Worker(normalize_url(u)) for u in urls]
        for w in workers:
            self.workers[w.url] = w
        await asyncio.gather(*(self._fetch_info(w) for w in workers))
        sizes = {w.url: w.page_size for w in workers if w.page_size is not None}
        if self.page_size is None and len(set(sizes.values())) > 1:
            raise PageSizeMismatch(
                "workers disagree on the KV page size (set the same --page-size on every worker): "
                + ", ".join(f"{u}={s}" for u, s in sizes.items())
            )
        for w in workers:
            self._admit(w)
        if self.on_added is not None:
            for w in workers:
                await self.on_added(w.url)

    async def add(self, url: str) -> Worker:
        url = normalize_url(url)
        if url in self.workers:
            raise KeyError(url)
        w = Worker(url)
        await self._fetch_info(w)
        self._admit(w)
        if w.problem is not None:
            raise PageSizeMismatch(w.problem)
        self.workers[url] = w
        log.info("worker %s added (healthy=%s)", url, w.healthy)
        if self.on_added is not None:
            await self.on_added(url)
        return w

    async def remove(self, url: str) -> Worker | None:
        w = self.workers.pop(url.rstrip("/"), None)
        if w is not None:
            log.info("worker %s removed", w.url)
            if self.on_removed is not None:
                await self.on_removed(w.url)
        return w

    def mark_failed(self, w: Worker, why: str) -> None:
        """A dispatch could not reach the worker: exclude it until a health check passes."""
        if w.healthy:
            w.healthy = False
            log.warning("worker %s marked unhealthy: %s", w.url, why)

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._every(self.health_interval, self.check_health)),
            asyncio.create_task(self._every(self.load_interval, self.poll_loads)),
        ]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []

    async def check_health(self) -> None:
        await asyncio.gather(*(self._check_one(w) for w in list(self.workers.values())))

    async def poll_loads(self) -> None:
        await asyncio.gather(*(self._poll_one(w) for w in self.healthy()))

    # internals -------------------------------------------------------------------------------

    async def _every(self, interval: float, job: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await job()
            except Exception:  # a bug in one round must not stop the loop
                log.exception("background job %s failed", getattr(job, "__name__", job))

    async def _get_json(self, url: str) -> Any:
        timeout = aiohttp.ClientTimeout(total=self.health_timeout)
        async with self.session.get(url, timeout=timeout) as resp:
            if resp.status != 200:
                return None
            return orjson.loads(await resp.read())

    async def _fetch_info(self, w: Worker) -> None:
        """Read page size and model names; sets w.healthy to whether the worker answered."""
        try:
            info = await self._get_json(w.url + "/server_info")
            if info is None:  # pre-0.5 SGLang only has the deprecated name
                info = await self._get_json(w.url + "/get_server_info")
            models, model_info = await asyncio.gather(
                self._get_json(w.url + "/v1/models"), self._get_json(w.url + "/model_info")
            )
        except (aiohttp.ClientError, asyncio.TimeoutError, orjson.JSONDecodeError) as e:
            log.warning("worker %s not reachable: %s", w.url, e or type(e).__name__)
            w.healthy = False
            return
        w.page_size = page_size_of(info) if isinstance(info, dict) else None
        w.models = models_of(models, model_info)
        w.probed = True
        w.healthy = True

    def _admit(self, w: Worker) -> bool:
        """Fix the cluster page size from the first worker reporting one; exclude dissenters.

        Returns whether the worker is healthy now."""
        if w.page_size is None:
            return w.healthy
        if self.page_size is None:
            self.page_size = w.page_size
            log.info("page size %d (from %s)", w.page_size, w.url)
        if w.page_size == self.page_size:
            w.problem = None
            return w.healthy
        problem = (
            f"worker {w.url} uses page size {w.page_size} but the router uses {self.page_size}"
        )
        if w.problem != problem:  # health checks re-admit every round: say it once
            log.error("%s; excluding it", problem)
        w.problem = problem
        w.healthy = False
        return False

    async def _check_one(self, w: Worker) -> None:
        ok = False
        try:
            timeout = aiohttp.ClientTimeout(total=self.health_timeout)
            async with self.session.get(w.url + "/health", timeout=timeout) as resp:
                ok = resp.status == 200
                await resp.read()
        except (aiohttp.ClientError, asyncio.TimeoutError):
            ok = False
        if ok and not w.healthy:
            # It may have restarted with other settings: read them again before admitting it.
            await self._fetch_info(w)
            if self._admit(w):
                log.info("worker %s is healthy", w.url)
        elif not ok and w.healthy:
            w.healthy = False
            log.warning("worker %s failed its health check; excluded", w.url)

    async def _poll_one(self, w: Worker) -> None:
        try:
            data = await self._get_json(w.url + "/v1/loads")
        except (aiohttp.ClientError, asyncio.TimeoutError, orjson.JSONDecodeError):
            data = None
        loads = data.get("loads") if isinstance(data, dict) else None
        if not isinstance(loads, list):
            w.reported_load = None
            return
        total = 0.0
        for entry in loads:
            if isinstance(entry, dict):
                total += float(entry.get("num_running_reqs") or 0)
                total += float(entry.get("num_waiting_reqs") or 0)
        w.reported_load = total
        w.reported_at = time.monotonic()
        w.inflight_at_report = w.inflight
