"""The router's view of the global KV tier (Mooncake as HiCache's L3), read from the master.

SGLang's MooncakeStore keeps one object per page, K and V apart, under
`{prefix}_{page digest hex}_{tp rank}_k|_v` (prefix: the served model name with '/' -> '-'; MHA
models; `mem_cache/storage/mooncake_store`). The router computes the same digests from the prompt
(features.hashing), so it asks the master itself which pages exist: `GET /batch_query_keys` on
the master's HTTP port (the one `--metrics_port` opens; the RPC-only client would need Mooncake's
native library in the router). A page counts when both its objects exist; the figure is the
leading run of such pages, which is what HiCache's prefetch loads.

Invariants (see NOTES.md): a lookup never blocks a decision longer than `budget_s`; an answer
the router cannot vouch for is None ("unknown"), never 0 ("miss"); after an outage or a master
restart (its counters go backwards) the cached positives are dropped, since the master keeps
its keys in memory and comes back empty.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import aiohttp
import orjson

from smetric_router.cluster.kv_index import KvIndex
from smetric_router.core.mooncake_keys import DIGEST, page_stems
from smetric_router.core.prometheus import readable_samples
from smetric_router.core.types import RequestFeatures

log = logging.getLogger(__name__)

# The master answers GETs of ~180 KB URLs; shorter chunks keep each answer small and parallel.
_KEYS_PER_QUERY = 512
_MAX_LATE = 4
_FIRST_RUN = 256  # pages in the first run asked (one round trip for most prompts); then 4x
# Counters every client's pings and calls move forward; any of them going back is a new master.
_MONOTONE = ("master_ping_requests_total", "master_mount_segment_requests_total")


class L3State(str, Enum):
    OK = "ok"  # the master answers: hits and misses are facts
    UNKNOWN = "unknown"  # unreachable, restarting, or not asked yet: no figure at all


@dataclass(frozen=True, slots=True)
class L3Config:
    master_url: str  # http://host:port of mooncake_master's HTTP (metrics) port
    tp_rank: int = 0  # whose keys to ask for (every TP rank writes its own)
    budget_s: float = 0.025  # longest a decision waits for the master
    ttl_s: float = 30.0  # how long a page seen in L3 is trusted without asking again
    max_pages: int = 4096  # pages asked per lookup beyond the cached ones
    health_interval_s: float = 1.0
    cache_pages: int = 1 << 18

    def __post_init__(self) -> None:
        if not self.master_url.startswith(("http://", "https://")):
            raise ValueError(f"the Mooncake master URL must be http(s)://, got {self.master_url!r}")
        if self.budget_s <= 0 or self.ttl_s < 0 or self.max_pages <= 0:
            raise ValueError("budget_s and max_pages must be > 0, ttl_s >= 0")


@dataclass(slots=True)
class L3Stats:
    lookups: dict[str, int]  # outcome -> count: hit, miss, unknown, timeout
    outages: int = 0  # times the master became unreachable
    resets: int = 0  # times the cached view was dropped (outage over, master restarted)
    keys: int | None = None  # the master's key count at the last health check
    queries: int = 0  # questions put to the master (each asks for the pages not cached)
    query_keys: int = 0
    query_seconds: float = 0.0  # their total time, answered or late


class MasterL3:
    """Leading pages of a prompt in L3, asked from the Mooncake master over HTTP, with a
    short-lived cache of pages seen there and a health loop that notices outages and restarts."""

    name = "master"

    def __init__(self, config: L3Config) -> None:
        self.config = config
        self.state = L3State.UNKNOWN
        self.stats = L3Stats({"hit": 0, "miss": 0, "unknown": 0, "timeout": 0})
        self._seen: dict[str, float] = {}  # key stem -> trusted until (monotonic)
        self._counters: dict[str, float] = {}
        self._was_ok = False
        self._late = 0  # lookups past their budget whose answer is still to come
        self._reset_at = 0.0
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, session: aiohttp.ClientSession) -> None:
        self._session = session
        await self.check_health()
        self._task = asyncio.create_task(self._health_loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    # -- lookups ----------------------------------------------------------------------------

    async def lookup(self, prefix: str, features: RequestFeatures) -> int | None:
        """Leading prompt tokens held in L3, or None when the tier's state is unknown."""
        if self.state is not L3State.OK:
            self.stats.lookups["unknown"] += 1
            return None
        digests = features.page_digests
        n = min(len(digests) // DIGEST, self.config.max_pages)
        stems = page_stems(prefix, digests[: n * DIGEST], self.config.tp_rank)
        now = time.monotonic()
        known = 0
        while known < n and self._seen.get(stems[known], 0.0) > now:
            known += 1
        if known < n:
            if self._late >= _MAX_LATE:  # the master is already behind: do not pile on
                self.stats.lookups["timeout"] += 1
                return None
            ask = stems[known:]
            query = asyncio.ensure_future(self._held(ask))
            done, _ = await asyncio.wait((query,), timeout=self.config.budget_s)
            if not done:
                # Too late for this decision, not for the next: its answer still fills the cache.
                self._late += 1
                query.add_done_callback(lambda q: self._absorb_late(q, ask, now))
                self.stats.lookups["timeout"] += 1
                return None
            try:
                held = query.result()
            except (aiohttp.ClientError, OSError, ValueError) as e:
                self._down(f"lookup failed: {e!r}")
                self.stats.lookups["unknown"] += 1
                return None
            self._remember(ask[: len(held)], held, now)
            for ok in held:
                if not ok:
                    break
                known += 1
        self.stats.lookups["hit" if known else "miss"] += 1
        return known * features.page_size

    async def _held(self, stems: list[str]) -> list[bool]:
        """Whether each page is held, for the pages up to the first one that is not: asked in
        growing runs, since the new turn's pages at the end of every prompt are never there and
        the master's answer costs per key."""
        started = time.perf_counter()
        out: list[bool] = []
        size = _FIRST_RUN
        while len(out) < len(stems):
            run = stems[len(out) : len(out) + size]
            keys = [s + kv for s in run for kv in ("_k", "_v")]
            chunks = [keys[i : i + _KEYS_PER_QUERY] for i in range(0, len(keys), _KEYS_PER_QUERY)]
            exists: dict[str, bool] = {}
            for answer in await asyncio.gather(*(self._query(c) for c in chunks)):
                exists.update(answer)
            self.stats.query_keys += len(keys)
            held = [exists.get(s + "_k", False) and exists.get(s + "_v", False) for s in run]
            out += held
            if not all(held):
                break
            size *= 4
        self.stats.queries += 1
        self.stats.query_seconds += time.perf_counter() - started
        return out

    async def _query(self, keys: list[str]) -> Mapping[str, bool]:
        assert self._session is not None, "start() first"
        url = f"{self.config.master_url}/batch_query_keys"
        async with self._session.get(url, params={"keys": ",".join(keys)}) as resp:
            raw = await resp.read()
        body: Any = orjson.loads(raw)
        if resp.status != 200 or not isinstance(body, dict) or not body.get("success"):
            raise ValueError(f"batch_query_keys answered {resp.status}: {raw[:200]!r}")
        data = body.get("data") or {}
        return {k: bool(isinstance(v, dict) and v.get("ok")) for k, v in data.items()}

    def _absorb_late(
        self, query: asyncio.Future[list[bool]], stems: list[str], asked: float
    ) -> None:
        self._late -= 1
        if query.cancelled() or query.exception() is not None:
            return
        if self.state is L3State.OK and asked >= self._reset_at:  # not from before a reset
            held = query.result()
            self._remember(stems[: len(held)], held, asked)

    def _remember(self, stems: list[str], held: list[bool], now: float) -> None:
        if len(self._seen) > self.config.cache_pages:
            self._seen.clear()
        until = now + self.config.ttl_s
        for s, ok in zip(stems, held, strict=True):
            if ok:
                self._seen[s] = until
            else:
                self._seen.pop(s, None)

    # -- health -----------------------------------------------------------------------------

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval_s)
            await self.check_health()

    async def check_health(self) -> None:
        """One look at the master's /metrics: reachable or not, restarted or not."""
        assert self._session is not None, "start() first"
        try:
            timeout = aiohttp.ClientTimeout(total=max(1.0, self.config.health_interval_s))
            async with self._session.get(
                f"{self.config.master_url}/metrics", timeout=timeout
            ) as resp:
                text = await resp.text()
            if resp.status != 200:
                raise ValueError(f"/metrics answered {resp.status}")
        except (aiohttp.ClientError, OSError, ValueError, TimeoutError) as e:
            self._down(f"/metrics: {e!r}")
            return
        counters = _parse_metrics(text)
        keys = counters.get("master_key_count")  # None: no count the router can vouch for
        self.stats.keys = int(keys) if keys is not None and math.isfinite(keys) else None
        restarted = any(counters.get(n, 0.0) < self._counters.get(n, 0.0) for n in _MONOTONE)
        self._counters = {n: counters.get(n, 0.0) for n in _MONOTONE}
        if self.state is not L3State.OK:
            log.info("Mooncake master %s reachable: L3 view on", self.config.master_url)
            if self._was_ok:  # after an outage: it may have restarted empty
                self._reset()
            self.state = L3State.OK
            self._was_ok = True
        elif restarted:
            log.warning("Mooncake master %s restarted (its store is empty): L3 view reset",
                        self.config.master_url)  # fmt: skip
            self._reset()

    def _down(self, why: str) -> None:
        if self.state is L3State.OK:
            self.stats.outages += 1
            log.warning("Mooncake master %s unreachable (%s): L3 hits unknown until it answers",
                        self.config.master_url, why)  # fmt: skip
        self.state = L3State.UNKNOWN
        self._counters = {}

    def _reset(self) -> None:
        self._seen.clear()
        self._reset_at = time.monotonic()
        self.stats.resets += 1


def _parse_metrics(text: str) -> dict[str, float]:
    """The master's unlabelled samples by name (its counters and gauges carry no labels), from
    the lines that parse: junk in the page costs its own lines, never the view."""
    return {s.name: s.value for s in readable_samples(text) if not s.labels}


class EventsL3:
    """Leading prompt tokens in L3 from the workers' L3 KV events (the fork's patch), kept in
    the KV index. Over-reports after the store evicts or restarts, which SGLang never sees."""

    name = "events"
    state = L3State.OK  # events cannot tell an outage: see the class docstring

    def __init__(self, index: KvIndex) -> None:
        self.index = index
        self.stats = L3Stats({"hit": 0, "miss": 0})

    async def start(self, session: aiohttp.ClientSession) -> None:
        """Nothing to start: the KV-event feeds fill the index."""

    async def stop(self) -> None:
        """Nothing to stop."""

    async def lookup(self, prefix: str, features: RequestFeatures) -> int | None:
        n = self.index.l3_match(features.page_hashes, features.page_size)
        self.stats.lookups["hit" if n else "miss"] += 1
        return n
