"""The worker registry: membership, roles, health, reported load and the router's own counts.

Load rule (what policies see as WorkerView.load): own + peers + others, where peers = what the
replicas that sync with this one have in flight (replicas/sync.py, milliseconds old) and others =
max(0, reported - (own + peers) when the report arrived). The router's own count is exact for its
dispatches and never stale; the report lags by up to one poll but also covers requests sent by
routers that do not sync. Only that foreign share is taken from the report, so a request of ours
that just finished stops counting at once instead of lingering until the next poll. A report older
than three poll intervals (or from a failed poll) is ignored. What is counted depends on the role
(summed over DP ranks):

- colocated worker: requests; own = in flight, reported = num_running_reqs + num_waiting_reqs;
- PD prefill: unprefilled tokens; own = prompt tokens dispatched minus the hit the view showed,
  until the prefill is done; reported = num_waiting_uncached_tokens. (total_prefill_uncached_tokens
  is a cumulative counter of prefilled tokens in SGLang and in the emulator, not a queue: unused.)
  SGLang 0.5.23 leaves the PD bootstrap queue (requests whose decode has not handshaken yet) out of
  num_waiting_uncached_tokens; the own count covers them from dispatch on, and as the report only
  ever adds a foreign share, never replaces or lowers the own count, they are not lost. The cost:
  while ours wait in bootstrap, other routers' tokens count only beyond our own.
- PD decode: KV tokens in use; own = prompt tokens of requests in flight; reported =
  num_used_tokens.

Unprefilled tokens (WorkerView.unprefilled), colocated workers only, by the same rule: own = the
prompt tokens this router has routed to the worker and not yet seen a first token of, each request
adding its prompt minus the hit its decision saw (PrefillShare); a stream's first body byte ends a
request's share, a non-streamed request holds it until its answer, the first byte the router sees
of it. peers = the syncing replicas' own counts; reported = num_waiting_uncached_tokens. SGLang
counts only its waiting queue there, not a prompt in (chunked) prefill, so the report undercounts
what a router's own count holds and the foreign share it adds is a lower bound: enough to see a
router that does not sync queueing prompts on a worker, never a double count of ours.

Running batch (WorkerView.running, LMetric's batch size): a colocated worker's reported
num_running_reqs as it stands in the last fresh report, with no own count mixed in, since the
router cannot tell which of its dispatches the engine has admitted; None without a fresh report
(or with no num_running_reqs in it) and for PD instances, whose load is counted in tokens.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from smetric_router.breaker.board import UNTRACKED, Breakers
from smetric_router.breaker.state import Outcome, Pass
from smetric_router.core.decay import RECENT_HALF_LIFE_S, DecayingSum
from smetric_router.core.tasks import cancel_and_wait
from smetric_router.router.upstream import is_local

log = logging.getLogger(__name__)

_STALE_POLLS = 3


class WorkerRejected(ValueError):
    pass


class _Refused(Exception):
    """The worker wants a key the router does not have (HTTP 401/403)."""


class Role(str, Enum):
    WORKER = "worker"  # prefill and decode colocated
    PREFILL = "prefill"
    DECODE = "decode"


# The /v1/loads field each role's load is corrected by (None: requests).
_REPORTED_TOKENS = {Role.PREFILL: "num_waiting_uncached_tokens", Role.DECODE: "num_used_tokens"}


def redact_url(url: str) -> str:
    """The URL for an error message or a log line: without user:password@, control characters
    escaped, cut at 200 characters."""
    if "@" in url:  # everything up to the last @ may be a secret
        scheme, sep, _ = url.partition("://")
        url = (scheme + sep if sep else "") + "***@" + url.rpartition("@")[2]
    return repr(url[:200])


def normalize_url(url: str) -> str:
    """A worker's base URL, scheme://host[:port] and nothing else: credentials would leak into
    headers, metrics and logs; a path, query or fragment would change every endpoint's meaning."""
    url = url.strip().rstrip("/")
    shown = redact_url(url)
    if any(c.isspace() or not c.isprintable() for c in url):
        raise ValueError(f"worker url must not contain blanks or control characters: {shown}")
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise ValueError(f"worker url must not carry credentials (user:password@): {shown}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"worker url must look like http://host:port, got {shown}")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ValueError(f"worker url has an invalid port: {shown}") from None
    if parts.path or parts.query or parts.fragment or "?" in url or "#" in url:
        raise ValueError(f"worker url must not have a path, query or fragment: {shown}")
    return url


@dataclass(slots=True, eq=False)
class Worker:
    url: str
    role: Role = Role.WORKER
    # PD prefill: the port handed to decode as bootstrap_port; None until configured or discovered.
    bootstrap_port: int | None = None
    bootstrap_port_fixed: bool = False  # given on the command line: never re-discovered
    healthy: bool = False
    # Consecutive health checks missed while in, and passed while out (the thresholds').
    health_misses: int = 0
    health_passes: int = 0
    inflight: int = 0
    tokens: int = 0  # PD: the router's own token count (see the load rule above)
    unprefilled: int = 0  # colocated: the own count of "Unprefilled tokens" above
    reported_load: float | None = None
    reported_running: int | None = None  # colocated: num_running_reqs of the last report
    reported_at: float = 0.0
    own_at_report: int = 0
    peers: int = 0  # the syncing replicas' counts, in own's unit (replicas/sync.py)
    peers_at_report: int = 0
    unprefilled_peers: int = 0  # colocated: the syncing replicas' unprefilled tokens
    reported_unprefilled: float | None = None  # colocated: num_waiting_uncached_tokens
    unprefilled_at_report: int = 0  # unprefilled + unprefilled_peers when the report arrived
    # new prompt tokens sent here, ever (the replicas' snapshots carry it), and lately, this
    # router's and its peers' (WorkerView.recent_tokens)
    routed_total: int = 0
    recent: DecayingSum = field(default_factory=lambda: DecayingSum(RECENT_HALF_LIFE_S))
    page_size: int | None = None
    models: frozenset[str] = frozenset()
    context_length: int | None = None  # the model's, from /v1/models (max_model_len)
    problem: str | None = None  # why the worker is excluded although it answers, if it is
    probed: bool = False
    refused: int | None = None  # the 401/403 its /server_info answered: no or a wrong key
    # Whether the worker loads from the global tier: False only when its /server_info says it
    # has no HiCache storage backend (a server that does not say is taken to have one).
    l3: bool = True
    # SGLang's --reasoning-parser, from /server_info: without one a worker refuses Anthropic
    # `thinking` (features/anthropic_thinking.py).
    reasoning_parser: str | None = None

    @property
    def hashes(self) -> bool:
        """Whether the router matches page hashes against this worker's KV events."""
        return self.role is not Role.DECODE

    @property
    def own(self) -> int:
        return self.inflight if self.role is Role.WORKER else self.tokens

    def load(self, now: float, max_age: float) -> float:
        fresh = now - self.reported_at <= max_age
        at_report = self.own_at_report + self.peers_at_report
        return _with_foreign(self.own + self.peers, self.reported_load, at_report, fresh)

    def unprefilled_load(self, now: float, max_age: float) -> int:
        """The unprefilled tokens a policy sees: this router's, its peers', the report's rest."""
        fresh = now - self.reported_at <= max_age
        seen = self.unprefilled + self.unprefilled_peers
        report = self.reported_unprefilled
        return int(_with_foreign(seen, report, self.unprefilled_at_report, fresh))

    def routed(self, tokens: int) -> None:
        """This router sent the worker a request with `tokens` new prompt tokens."""
        self.routed_total += tokens
        self.recent.add(tokens, time.monotonic())

    def running(self, now: float, max_age: float) -> int | None:
        if self.role is not Role.WORKER or now - self.reported_at > max_age:
            return None
        return self.reported_running

    def describe(self, now: float, max_age: float) -> dict[str, Any]:
        out: dict[str, Any] = {
            "url": self.url,
            "role": self.role.value,
            "healthy": self.healthy,
            "health_misses": self.health_misses,  # in a row, while in (--health-failure-threshold)
            "inflight": self.inflight,
            "peers": self.peers,
            "load": self.load(now, max_age),
            "reported_load": self.reported_load,
            "running": self.running(now, max_age),
            "page_size": self.page_size,
            "models": sorted(self.models),
            "context_length": self.context_length,
            "problem": self.problem,
        }
        if self.role is Role.WORKER:
            out["unprefilled"] = self.unprefilled
            out["unprefilled_load"] = self.unprefilled_load(now, max_age)
        else:
            out["tokens"] = self.tokens
        if self.role is Role.PREFILL:
            out["bootstrap_port"] = self.bootstrap_port
        return out


def _with_foreign(seen: int, reported: float | None, seen_at_report: int, fresh: bool) -> float:
    """What the syncing routers counted, plus the part of a fresh report none of them sent."""
    if reported is None or not fresh:
        return float(seen)
    return seen + max(0.0, reported - seen_at_report)


class PrefillShare:
    """One request's share of its worker's unprefilled tokens, taken when it is sent and given back
    once, at its first byte or when it ends, whichever comes first."""

    __slots__ = ("_counted", "_tokens", "_worker")

    def __init__(
        self, worker: Worker, tokens: int, counted: Callable[[], None] = lambda: None
    ) -> None:
        self._worker, self._tokens, self._counted = worker, tokens, counted
        worker.unprefilled += tokens
        worker.routed(tokens)

    def done(self) -> None:
        if self._tokens:
            self._worker.unprefilled -= self._tokens
            self._tokens = 0
            self._counted()


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


def context_length_of(v1_models: Any) -> int | None:
    """The served context length: SGLang's /v1/models gives it as its model card's max_model_len
    (model_config.context_len); LoRA adapter cards carry none."""
    if not isinstance(v1_models, dict):
        return None
    for m in v1_models.get("data") or ():
        n = m.get("max_model_len") if isinstance(m, dict) else None
        if type(n) is int and n > 0:
            return n
    return None


def bootstrap_port_of(server_info: dict[str, Any]) -> int | None:
    port = server_info.get("disaggregation_bootstrap_port")
    return port if isinstance(port, int) and 0 < port < 65536 else None


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """A worker as configured: PD prefills may carry their bootstrap port (None: discover it)."""

    url: str
    role: Role = Role.WORKER
    bootstrap_port: int | None = None

    def __post_init__(self) -> None:
        normalize_url(self.url)
        if self.bootstrap_port is not None and not 0 < self.bootstrap_port < 65536:
            raise ValueError(f"bootstrap port of {self.url} must be in 1..65535")
        if self.bootstrap_port is not None and self.role is not Role.PREFILL:
            raise ValueError(f"only prefill workers take a bootstrap port ({self.url})")

    def make(self) -> Worker:
        return Worker(
            normalize_url(self.url),
            role=self.role,
            bootstrap_port=self.bootstrap_port,
            bootstrap_port_fixed=self.bootstrap_port is not None,
        )


Hook = Callable[[str], Awaitable[None]]


@dataclass(slots=True)
class WorkerRegistry:
    session: aiohttp.ClientSession
    page_size: int | None = None  # fixed by --page-size, else by the first worker that reports one
    health_interval: float = 5.0
    health_timeout: float = 5.0
    health_failure_threshold: int = 3  # the config's defaults
    health_success_threshold: int = 2
    load_interval: float = 1.0
    on_added: Hook | None = None
    on_removed: Hook | None = None
    headers: dict[str, str] = field(default_factory=dict, repr=False)  # the worker key, if any
    # Circuits (smetric_router/breaker/), apart from health: None with --disable-circuit-breaker.
    breakers: Breakers | None = None
    workers: dict[str, Worker] = field(default_factory=dict)
    # Set when a dispatch or an answer changes the router's own counts: what shares them with
    # other replicas (replicas/sync.py) wakes on it instead of polling them.
    counts_changed: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def max_load_age(self) -> float:
        return _STALE_POLLS * self.load_interval

    def counted(self) -> None:
        """The router's own counts changed (a request sent to a worker or answered)."""
        self.counts_changed.set()

    def healthy(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.healthy]

    def of_role(self, role: Role) -> list[Worker]:
        return [w for w in self.workers.values() if w.role is role]

    def models(self) -> frozenset[str]:
        return frozenset().union(*(w.models for w in self.workers.values()))

    def can_reason(self, model: str | None) -> bool:
        """Whether some healthy worker of the model (None: any) has a reasoning parser."""
        return any(
            w.reasoning_parser is not None and (model is None or model in w.models)
            for w in self.healthy()
        )

    def describe(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [self.describe_one(w, now) for w in self.workers.values()]

    def describe_one(self, w: Worker, now: float) -> dict[str, Any]:
        out = w.describe(now, self.max_load_age)
        if self.breakers is not None:
            out["circuit"] = self.breakers.describe(w.url)
        return out

    def takes_requests(self, url: str) -> bool:
        """Whether the worker's circuit lets a request through now (its health aside)."""
        return self.breakers is None or self.breakers.available(url)

    def begin(self, url: str, last: bool) -> Pass | None:
        """The worker's circuit lets this attempt through (None: retry elsewhere). With nowhere
        else to go it goes anyway, untracked: the client gets the worker's own answer rather
        than the router's refusal."""
        if self.breakers is None:
            return UNTRACKED
        passed = self.breakers.begin(url)
        return UNTRACKED if passed is None and last else passed

    def record(self, url: str, passed: Pass, outcome: Outcome) -> None:
        """What an attempt let through by begin() said about the worker."""
        if self.breakers is not None:
            self.breakers.record(url, passed, outcome)

    async def initialize(self, specs: Iterable[WorkerSpec]) -> None:
        """Register the start-up workers; those reachable now must agree on the page size."""
        workers = [s.make() for s in specs]
        for w in workers:
            self.workers[w.url] = w
        await asyncio.gather(*(self._fetch_info(w) for w in workers))
        sizes = {w.url: w.page_size for w in workers if w.page_size is not None and w.hashes}
        if self.page_size is None and len(set(sizes.values())) > 1:
            raise WorkerRejected(
                "workers disagree on the KV page size (set the same --page-size on every worker): "
                + ", ".join(f"{u}={s}" for u, s in sizes.items())
            )
        for w in workers:
            self._admit(w)
        if self.on_added is not None:
            for w in workers:
                await self.on_added(w.url)

    async def add(self, spec: WorkerSpec) -> Worker:
        w = spec.make()
        url = w.url
        if url in self.workers:
            raise KeyError(url)
        await self._fetch_info(w)
        self._admit(w)
        if w.problem is not None:
            raise WorkerRejected(w.problem)
        self.workers[url] = w
        log.info("worker %s added (healthy=%s)", url, w.healthy)
        if self.on_added is not None:
            await self.on_added(url)
        return w

    async def remove(self, url: str) -> Worker | None:
        w = self.workers.pop(url.rstrip("/"), None)
        if w is not None:
            log.info("worker %s removed", w.url)
            if self.breakers is not None:
                self.breakers.remove(w.url)
            if self.on_removed is not None:
                await self.on_removed(w.url)
        return w

    def mark_failed(self, w: Worker, why: str) -> None:
        """A dispatch could not reach the worker: exclude it until --health-success-threshold
        health checks in a row pass."""
        w.health_passes = 0
        if w.healthy:
            w.healthy = False
            log.warning("worker %s marked unhealthy: %s", w.url, why)

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._every(self.health_interval, self.check_health)),
            asyncio.create_task(self._every(self.load_interval, self.poll_loads)),
        ]

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
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
        async with self.session.get(url, timeout=timeout, headers=self.headers) as resp:
            if resp.status in (401, 403):
                raise _Refused(resp.status)
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
        except _Refused as e:
            # it answers, so _admit excludes it with the reason (said once)
            w.refused, w.probed, w.healthy = e.args[0], True, True
            return
        w.refused = None
        w.page_size = page_size_of(info) if isinstance(info, dict) else None
        if w.role is Role.PREFILL and not w.bootstrap_port_fixed:
            w.bootstrap_port = bootstrap_port_of(info) if isinstance(info, dict) else None
        w.models = models_of(models, model_info)
        w.context_length = context_length_of(models)
        w.l3 = not isinstance(info, dict) or bool(info.get("hicache_storage_backend", True))
        parser = info.get("reasoning_parser") if isinstance(info, dict) else None
        w.reasoning_parser = parser if isinstance(parser, str) and parser else None
        w.probed = True
        w.healthy = True

    def _admit(self, w: Worker) -> bool:
        """Fix the cluster page size from the first worker reporting one; exclude dissenters and
        prefills without a bootstrap port.

        Returns whether the worker is healthy now."""
        problem = self._problem(w)
        if problem is None:
            w.problem = None
            return w.healthy
        if w.problem != problem:  # health checks re-admit every round: say it once
            log.error("%s; excluding it", problem)
        w.problem = problem
        w.healthy = False
        return False

    def _problem(self, w: Worker) -> str | None:
        if w.refused is not None:
            return (
                f"worker {w.url} refuses the router's requests (HTTP {w.refused}): give the "
                "router its key with --worker-api-key (the worker's --api-key)"
            )
        if w.role is Role.PREFILL and w.bootstrap_port is None and w.probed:
            return (
                f"prefill {w.url} reports no disaggregation_bootstrap_port in /server_info; "
                "give it as --prefill URL PORT"
            )
        if w.page_size is None or not w.hashes:
            return None
        if self.page_size is None:
            self.page_size = w.page_size
            log.info("page size %d (from %s)", w.page_size, w.url)
        if w.page_size == self.page_size:
            return None
        return f"worker {w.url} uses page size {w.page_size} but the router uses {self.page_size}"

    async def _check_one(self, w: Worker) -> None:
        ok = False
        try:
            timeout = aiohttp.ClientTimeout(total=self.health_timeout)
            async with self.session.get(
                w.url + "/health", timeout=timeout, headers=self.headers
            ) as resp:
                ok = resp.status == 200
                await resp.read()
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            if is_local(e):  # the router is out of file descriptors: nothing about the worker
                log.warning("health check of %s skipped: %s", w.url, e)
                return
            ok = False
        if ok:
            w.health_misses = 0
            if not w.healthy:
                await self._passed_while_out(w)
            return
        w.health_passes = 0
        if not w.healthy:
            return
        w.health_misses += 1
        if w.health_misses < self.health_failure_threshold:
            log.info(
                "worker %s missed a health check (%d of %d before it is excluded)",
                w.url, w.health_misses, self.health_failure_threshold,
            )  # fmt: skip
            return
        w.healthy = False
        w.health_misses = 0
        log.warning(
            "worker %s failed %d health check(s) in a row; excluded",
            w.url,
            self.health_failure_threshold,
        )

    async def _passed_while_out(self, w: Worker) -> None:
        # A worker that never answered comes in on its first pass; one that was in and went
        # out must pass the threshold in a row, so that a flapping worker stays out.
        w.health_passes += 1
        if w.probed and w.health_passes < self.health_success_threshold:
            return
        # It may have restarted with other settings: read them again before admitting it.
        await self._fetch_info(w)
        if self._admit(w):
            w.health_passes = 0
            log.info("worker %s is healthy", w.url)

    async def _poll_one(self, w: Worker) -> None:
        try:
            data = await self._get_json(w.url + "/v1/loads")
        except (aiohttp.ClientError, asyncio.TimeoutError, orjson.JSONDecodeError, _Refused):
            data = None
        loads = data.get("loads") if isinstance(data, dict) else None
        if not isinstance(loads, list):
            w.reported_load = w.reported_running = w.reported_unprefilled = None
            return
        field = _REPORTED_TOKENS.get(w.role)
        total = 0.0
        running: int | None = None
        uncached: int | None = None
        for entry in loads:
            if not isinstance(entry, dict):
                continue
            n = entry.get("num_running_reqs")
            if isinstance(n, int) and not isinstance(n, bool):
                running = (running or 0) + n
            u = entry.get("num_waiting_uncached_tokens")
            if isinstance(u, int) and not isinstance(u, bool):
                uncached = (uncached or 0) + u
            if field is None:
                total += float(entry.get("num_running_reqs") or 0)
                total += float(entry.get("num_waiting_reqs") or 0)
            else:
                total += float(entry.get(field) or 0)
        w.reported_load = total
        w.reported_running = running
        w.reported_unprefilled = uncached if w.role is Role.WORKER else None
        w.reported_at = time.monotonic()
        w.own_at_report = w.own
        w.peers_at_report = w.peers
        w.unprefilled_at_report = w.unprefilled + w.unprefilled_peers
