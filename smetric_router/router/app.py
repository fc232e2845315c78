"""The router's HTTP surface (aiohttp): generation endpoints, worker admin, metrics."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import CONTENT_TYPE_LATEST

from smetric_router.admission.buckets import RateLimiter
from smetric_router.admission.errors import rate_limited, refusal
from smetric_router.admission.gate import Gate, Shed, Ticket
from smetric_router.admission.metrics import RATE_LIMIT, AdmissionMetrics, kind
from smetric_router.admission.order import ANONYMOUS
from smetric_router.admission.room import WorkerRoom, queued
from smetric_router.admission.tenants import Tenant
from smetric_router.breaker.board import Breakers
from smetric_router.breaker.metrics import BreakerMetrics
from smetric_router.cluster.inflight import InflightPrefixes
from smetric_router.cluster.kv_index import KvIndex
from smetric_router.cluster.l3_view import EventsL3, L3State, MasterL3
from smetric_router.core import tracing
from smetric_router.core.types import NoWorkerAvailable, RequestFeatures
from smetric_router.discovery.register import Discovery, start_discovery
from smetric_router.features import anthropic_thinking
from smetric_router.features.errors import FeatureError
from smetric_router.features.extract import strip_hint
from smetric_router.policies import make_policy
from smetric_router.policies.follow_up_priority import follow_up_priority
from smetric_router.policies.turn import resolve_turn
from smetric_router.replicas.sync import ReplicaSync, SyncCollector, SyncConfig
from smetric_router.router import api_messages, api_responses
from smetric_router.router.auth import (
    AuthPolicy,
    auth_refusal,
    tenant_header,
    tenant_of,
    upstream_auth_header,
)
from smetric_router.router.config import PRIORITY_RANGE, RouterConfig
from smetric_router.router.dashboard import Sampler, SamplerTimer, data_handler, handle_page
from smetric_router.router.drain import SHUTDOWN_CODE, Drain, take_ended
from smetric_router.router.errors import RouterError, bad_request, no_worker
from smetric_router.router.http_guards import (
    add_catch_all,
    expect_continue,
    hide_server,
    quiet_client_faults,
)
from smetric_router.router.kv import KvFeeds
from smetric_router.router.limits import upstream_connection_limit
from smetric_router.router.metrics import STREAM_ERROR, L3Sample, RouterMetrics, WorkerSample
from smetric_router.router.pd import Pair, PdProxy, pd_decision_attributes
from smetric_router.router.probe import Prober
from smetric_router.router.proxy import (
    STREAM_CUT,
    Proxy,
    decision_attributes,
    feature_attributes,
)
from smetric_router.router.routing import (
    DEFAULT_PAGE_SIZE,
    Endpoint,
    Features,
    HitIndex,
    Routed,
    Router,
    TextTree,
)
from smetric_router.router.upstream import Upstream
from smetric_router.router.workers import Role, Worker, WorkerRegistry, WorkerSpec, normalize_url

log = logging.getLogger(__name__)

STATE: web.AppKey[RouterState] = web.AppKey("smetric_router_state")
# A client that goes away cancels its handler, which closes the upstream request at once (the
# worker then aborts it) instead of when the next chunk fails to write.
RUNNER_OPTIONS: dict[str, Any] = {"handler_cancellation": True, "access_log": None}


class RouterState:
    """Everything one router process holds. Nothing here grows with the number of sessions."""

    def __init__(
        self,
        config: RouterConfig,
        features_for: Callable[[int], Features],
        hits: HitIndex | None,
        text_tree: TextTree | None,
        kv_feeds: KvFeeds | None,
        l3: MasterL3 | EventsL3 | None = None,
    ) -> None:
        self.config = config
        self.l3 = l3
        self.features_for = features_for
        self.hits = hits
        self.text_tree = text_tree
        self.kv_feeds = kv_feeds
        # The pages of requests in flight, per worker (the KV-serving side only: not decode).
        self.inflight = InflightPrefixes() if config.inflight_prefixes else None
        if self.inflight is not None and isinstance(hits, KvIndex):
            # Evictions in a worker's KV events outvote the grace of its ended requests.
            hits.on_evicted = self.inflight.forget_ended
        self.started = int(time.time())
        self.drain = Drain()  # graceful shutdown (router/drain.py)
        self.response_ids = api_responses.ResponseIds(config.response_id_key)
        self._session: aiohttp.ClientSession | None = None
        self._registry: WorkerRegistry | None = None
        self._router: Router | None = None
        self._proxy: Proxy | None = None
        self._upstream: Upstream | None = None
        self.pd: PdProxy | None = None  # set under PD disaggregation
        self.discovery: Discovery | None = None  # --service-discovery, --discovery-provider
        self.replica_sync: ReplicaSync | None = None  # --processes, --replica-sync-bind
        self.started_at = time.monotonic()
        self.metrics = RouterMetrics(self.sample_workers, self.sample_l3 if l3 else None)
        # /dashboard's per-second history (router/dashboard.py)
        self.sampler = Sampler(
            self.sample_workers,
            self.metrics.decision_counts,
            self.metrics.tier_counts,
            sample_l3=self.sample_l3,
            feed_batches=self._feed_batches,
        )
        self._timer = SamplerTimer(self.sampler, self.metrics.loop_lag.set)
        # --api-key-file's tenants (admission/tenants.py); None: one tenant, "anonymous"
        self.tenants = config.tenants()
        self.auth = config.auth(self.tenants)
        self.tenant_names = self.tenants.names if self.tenants is not None else (ANONYMOUS,)
        limits = RateLimiter(
            self.tenants.limits() if self.tenants else (),
            time.monotonic,
            router_tokens_per_second=config.rate_limit_tokens_per_second,
        )
        self.limits = limits if limits else None  # None: no limit at all
        admission = config.admission()
        weights = self.tenants.weights() if self.tenants is not None else None
        # None when off: the request path then checks one attribute and nothing else
        self.admission = (
            None
            if admission is None
            else Gate(admission, self._worker_rooms, self._admission_metrics, weights=weights)
        )
        # with the queue, tenants or a rate limit: admission's counters (the limits apply and
        # are counted without the queue too); None: none of them, nothing on the request path
        self.admission_metrics: AdmissionMetrics | None = (
            self.admission.metrics
            if self.admission is not None
            else AdmissionMetrics(self.metrics.registry, self.tenant_names, None, None)
            if self.tenants is not None or self.limits is not None
            else None
        )

    def _admission_metrics(self, gate: Gate) -> AdmissionMetrics:
        return AdmissionMetrics(
            self.metrics.registry, self.tenant_names, gate.queued_by_tenant, lambda: gate.running
        )

    def _worker_rooms(self) -> list[WorkerRoom]:
        """The workers admission weighs (the KV-serving side: prefill under PD, whose reports
        carry no running batch, so there only the cluster cap applies). One whose circuit is
        open is no room, whatever its queue: the policy will not send it anything."""
        registry = self._registry
        if registry is None:
            return []
        now, max_age = time.monotonic(), registry.max_load_age
        role = Role.PREFILL if self.config.pd_disaggregation else Role.WORKER
        return [
            WorkerRoom(
                w.url,
                w.healthy and registry.takes_requests(w.url),
                queued(w.load(now, max_age), w.running(now, max_age)),
            )
            for w in registry.of_role(role)
        ]

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "router not started"
        return self._session

    @property
    def registry(self) -> WorkerRegistry:
        assert self._registry is not None, "router not started"
        return self._registry

    @property
    def router(self) -> Router:
        assert self._router is not None, "router not started"
        return self._router

    @property
    def proxy(self) -> Proxy:
        assert self._proxy is not None, "router not started"
        return self._proxy

    async def start(self) -> None:
        c = self.config
        self.started_at = time.monotonic()
        # Many concurrent streams: no pool cap per worker; the overall cap guards file descriptors.
        connector = aiohttp.TCPConnector(limit=8192, limit_per_host=0, keepalive_timeout=60)
        self._session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            # Bytes pass through as the worker sent them: no Accept-Encoding of the router's own.
            skip_auto_headers=("Accept-Encoding", "User-Agent"),
            # A proxy keeps no cookies (and skips the jar's per-request filtering).
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        self._registry = WorkerRegistry(
            session=self._session,
            page_size=c.page_size,
            health_interval=c.health_check_interval_secs,
            health_timeout=c.health_check_timeout_secs,
            health_failure_threshold=c.health_failure_threshold,
            health_success_threshold=c.health_success_threshold,
            load_interval=c.load_poll_interval_secs,
            on_added=self._worker_added,
            on_removed=self._worker_removed,
            headers=c.worker_headers(),
        )
        breaker = c.breaker()
        if breaker is not None:
            self._registry.breakers = Breakers(breaker, BreakerMetrics(self.metrics.registry))
        if c.pd_disaggregation:
            # The prefill side is where KV reuse pays: it gets the hits and the text tree.
            policy = make_policy(c.prefill_policy_name, c.policy_params)
            role = Role.PREFILL
        else:
            policy, role = make_policy(c.policy, c.policy_params), Role.WORKER
        self._router = Router(
            policy,
            self._registry,
            self.metrics,
            self.features_for,
            self.hits,
            self.text_tree,
            role=role,
            prober=Prober(self._session, c.probe_timeout_secs, self.metrics, c.worker_headers())
            if c.cache_view == "probe"
            else None,
            l3=self.l3,
            l3_key_prefix=c.l3_key_prefix,
            inflight=self.inflight,
            context_length=c.context_length,
            session_hints=c.session_hints,
        )
        self._upstream = Upstream(
            connect_timeout=min(10.0, c.request_timeout_secs),
            max_connections=upstream_connection_limit(c.max_upstream_connections),
        )
        self._proxy = Proxy(
            upstream=self._upstream,
            router=self._router,
            registry=self._registry,
            metrics=self.metrics,
            max_retries=c.max_retries,
            timeout=c.request_timeout_secs,
            first_byte_timeout=c.first_byte_timeout_secs,
            stream_idle_timeout=c.stream_idle_timeout_secs,
            retry_on_reset=c.retry_on_reset,
        )
        if c.pd_disaggregation:
            decode_policy = make_policy(c.decode_policy, c.policy_params)
            self.pd = PdProxy(
                upstream=self._upstream,
                prefill_router=self._router,
                decode_router=Router(
                    decode_policy, self._registry, self.metrics, self.features_for, role=Role.DECODE
                ),
                registry=self._registry,
                metrics=self.metrics,
                max_retries=c.max_retries,
                timeout=c.request_timeout_secs,
                handover_timeout=c.pd_handover_timeout_secs,
                first_byte_timeout=c.first_byte_timeout_secs,
                stream_idle_timeout=c.stream_idle_timeout_secs,
                retry_on_reset=c.retry_on_reset,
            )
        try:
            if self.l3 is not None:
                await self.l3.start(self._session)
            await self._registry.initialize(c.worker_specs())
            self.discovery = await start_discovery(c, self._registry, self.metrics.registry)
        except BaseException:
            if self.l3 is not None:
                await self.l3.stop()
            await self._session.close()
            raise
        self._registry.start()
        if c.replica_sync_bind is not None:
            workers = self._registry.workers
            self.replica_sync = ReplicaSync(
                SyncConfig(c.replica_sync_bind, c.replica_sync_peers),
                workers.values,
                limits=self.limits,
                changed=self._registry.counts_changed,
            )
            await self.replica_sync.start()
            self.metrics.registry.register(SyncCollector(self.replica_sync))
        self._timer.start()

    async def stop(self) -> None:
        await self._timer.stop()
        if self.replica_sync is not None:
            await self.replica_sync.stop()
        if self.admission is not None:
            await self.admission.close()
        if self.discovery is not None:  # first: it would add workers to a stopping registry
            await self.discovery.stop()
        if self._registry is not None:
            await self._registry.stop()
        if self.kv_feeds is not None:
            await self.kv_feeds.stop()
        if self.l3 is not None:
            await self.l3.stop()
        if self._upstream is not None:
            self._upstream.close()
        if self._session is not None:
            await self._session.close()

    async def _worker_added(self, url: str) -> None:
        w = self.registry.workers.get(url)
        if self.kv_feeds is not None and w is not None and w.hashes:
            await self.kv_feeds.add_worker(url)

    async def _worker_removed(self, url: str) -> None:
        if self.kv_feeds is not None:
            await self.kv_feeds.remove_worker(url)
        self.forget_guesses(url)

    def forget_guesses(self, url: str) -> None:
        """Drop what the router itself guesses the worker caches (the text tree, in-flight
        pages): it was removed, or its cache flushed."""
        if self.text_tree is not None:
            self.text_tree.remove_worker(url)
        if self.inflight is not None:
            self.inflight.remove_worker(url)

    def _feed_batches(self, url: str) -> int | None:
        feed = self.kv_feeds.stats(url) if self.kv_feeds is not None else None
        return None if feed is None else feed.batches_applied

    def sample_l3(self) -> L3Sample | None:
        l3 = self.l3
        if l3 is None:
            return None
        return L3Sample(
            source=l3.name,
            ok=l3.state is L3State.OK,
            lookups=dict(l3.stats.lookups),
            outages=l3.stats.outages,
            resets=l3.stats.resets,
            keys=l3.stats.keys,
            pages=l3.index.l3_pages if isinstance(l3, EventsL3) else None,
            queries=l3.stats.queries,
            query_keys=l3.stats.query_keys,
            query_seconds=l3.stats.query_seconds,
        )

    def sample_workers(self) -> list[WorkerSample]:
        if self._registry is None:
            return []
        now = time.monotonic()
        max_age = self._registry.max_load_age
        out = []
        for w in self._registry.workers.values():
            kv = self.kv_feeds.stats(w.url) if self.kv_feeds is not None else None
            out.append(
                WorkerSample(
                    url=w.url,
                    healthy=w.healthy,
                    inflight=w.inflight,
                    load=w.load(now, max_age),
                    kv_connected=kv.connected if kv else None,
                    kv_resets=kv.resets if kv else 0,
                    kv_gaps_recovered=kv.gaps_recovered if kv else 0,
                    kv_decode_errors=kv.decode_errors if kv else 0,
                    kv_stalls=kv.stalls if kv else 0,
                    inflight_pages=self.inflight.pages(w.url)
                    if self.inflight is not None and w.role is not Role.DECODE
                    else None,
                    unprefilled=w.unprefilled_load(now, max_age) if w.role is Role.WORKER else None,
                    recent_tokens=w.recent.value(now) if w.role is not Role.DECODE else None,
                )
            )
        return out


# Handlers ------------------------------------------------------------------------------------


async def read_json_object(request: web.Request, limit: int) -> tuple[bytes, dict[str, Any]]:
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(limit)
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise _too_large(limit) from None
    except web.RequestPayloadError as e:  # e.g. a body that fails its Content-Encoding
        why = " ".join(str(e).split())
        raise bad_request(f"We could not read the body of your request: {why}") from None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise bad_request(f"We could not parse the JSON body of your request: {e}") from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    return raw, body


def _too_large(limit: int) -> RouterError:
    return RouterError(413, f"The request body exceeds {limit} bytes.", code="request_too_large")


def _check_model(body: dict[str, Any], registry: WorkerRegistry) -> str | None:
    """The model to route by, None = any worker. Like SGLang, a cluster serving one model (a
    name, with its aliases, every worker serves) takes any name, as clients often send "default";
    with several models the name picks the workers, and an unknown one is a 404."""
    model = body.get("model")
    if model is None:
        return None
    if not isinstance(model, str):
        raise bad_request("'model' must be a string.", param="model")
    names = [w.models for w in registry.workers.values() if w.models]
    if not names or model in frozenset().union(*names):
        return model if names else None
    if frozenset.intersection(*names):
        return None  # one model: whatever it is called here
    raise RouterError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


def generation_handler(endpoint: Endpoint) -> Callable[[web.Request], Any]:
    label = endpoint.value

    async def handle(request: web.Request) -> web.StreamResponse:
        state = request.app[STATE]
        started = time.perf_counter()
        status: int | str = 499  # stays so only when the client went away before an answer
        try:
            if state.drain.draining:
                raise _shutting_down("The router is shutting down: send the request again.")
            with state.drain.track(asyncio.current_task()):
                resp = await _generate(state, request, endpoint, started)
            status = STREAM_ERROR if request.get(STREAM_CUT) else resp.status
            return resp
        except asyncio.CancelledError:
            # the client went away, or the grace ran out while a stream was being written to a
            # slow client (copy_stream ends those it catches waiting for the worker): cut it
            if not take_ended() or request.writer.output_size:
                raise
            # The shutdown grace ran out before the worker answered.
            e = _shutting_down("The router shut down before the worker answered.")
            status = e.status
            return e.response()
        except RouterError as e:
            status = e.status
            return e.response()
        except Exception as e:
            if isinstance(e, ConnectionResetError) and _client_gone(request):
                # a write to a client that had just left, before its cancellation arrived:
                # nothing went wrong and no one is left to answer
                log.debug("client left during its answer on %s", label)
                return web.StreamResponse()
            log.exception("internal error on %s", label)
            status = 500
            return RouterError(
                500, "internal router error", type_="server_error", code="internal_error"
            ).response()
        finally:
            state.metrics.answered(label, status, time.perf_counter() - started)

    return handle


class _Stages:
    """Times the stages of one request's way to its decision (smetric_decision_stage_seconds)."""

    __slots__ = ("last", "metrics")

    def __init__(self, metrics: RouterMetrics, started: float) -> None:
        self.metrics, self.last = metrics, started

    def done(self, stage: str) -> None:
        now = time.perf_counter()
        self.metrics.stage(stage, now - self.last)
        self.last = now


def _shutting_down(message: str) -> RouterError:
    return RouterError(503, message, type_="server_error", code=SHUTDOWN_CODE,
                       headers={"Connection": "close"})  # fmt: skip


async def _generate(
    state: RouterState, request: web.Request, endpoint: Endpoint, started: float
) -> web.StreamResponse:
    with tracing.span("read_body") as span:
        raw, body = await read_json_object(request, state.config.max_body_bytes)
        span.set("smetric.body_bytes", len(raw))
    clock = _Stages(state.metrics, started)
    clock.done("body")
    model = _check_model(body, state.registry)
    # SGLang's `priority` (forwarded as sent): orders the tenant's requests in the router queue
    priority = _priority(body, tenant_of(request)) if state.admission_metrics else 0
    router = state.router
    if endpoint is Endpoint.RESPONSES:
        # ids in and out carry their worker; a continued response goes to its holder
        holder = api_responses.restore_previous(state.response_ids, state.registry, request, body)
        if holder is not None:
            if state.pd is not None:
                why = "previous_response_id needs a response store, which SGLang has not under PD"
                raise bad_request(why, param="previous_response_id")
            strip_hint(body)
            sent = follow_up_priority(1, body.get("priority"), state.config.follow_up_priority)
            if sent is not None:  # continuing a stored response is a follow-up
                body["priority"] = sent
            routed = router.route_to(holder.url, model, api_responses.HOLDER_REASON)
            stream = body.get("stream") is True
            raw = orjson.dumps(body)
            label = endpoint.value
            # the stored history is the worker's: only the request counts against its limits
            ticket = await _admit(state, request, holder.url, True, 0, priority)
            try:
                state.metrics.routed(label, api_responses.HOLDER_REASON)
                return await state.proxy.dispatch(
                    request, label, raw, routed, started, label, stream
                )
            finally:
                if ticket is not None:
                    ticket.release()
    edited = endpoint is Endpoint.MESSAGES and _drop_thinking(state, body, model)
    try:
        # A Messages or Responses request is routed as the chat request SGLang turns it into;
        # sent as it came.
        seen, kind = body, endpoint
        if endpoint is Endpoint.MESSAGES:
            seen, kind = router.features.messages_chat(body), Endpoint.CHAT
        elif endpoint is Endpoint.RESPONSES:
            seen, kind = router.features.responses_chat(body), Endpoint.CHAT
        with tracing.span("features") as span:
            features = await router.extract(kind, seen, request.headers, model)
            features = router.hinted(features, request.headers, body)  # the client's own body
            if tracing.enabled:
                span.set_many(feature_attributes(features))
        clock.done("features")
        probed = await router.probe(seen, model)  # None unless --cache-view probe
        if probed is not None:
            clock.done("cache_view")
        # 0 unless --l3-view; asked beside the request, waited for only where the decision
        # turns on it (_decide)
        later = router.l3_later(features, model) if state.pd is None else None
        l3 = None if later is not None else await router.l3_lookup(features, model)
        if router.l3 is not None and state.pd is not None:
            clock.done("l3")
        if strip_hint(body) or edited:
            raw = orjson.dumps(body)
    except FeatureError as e:
        raise bad_request(str(e)) from None
    decided = await _decide(state, router, features, model, probed, l3, later, clock)
    clock.done("decide")
    state.metrics.decide_seconds.observe(time.perf_counter() - started)
    label = endpoint.value
    ticket = None
    setting = state.config.follow_up_priority
    if setting or state.admission_metrics is not None:
        first = decided.prefill if isinstance(decided, Pair) else decided
        turn = resolve_turn(features, first.view.workers)
        sent = follow_up_priority(turn, body.get("priority"), setting)
        if sent is not None and endpoint is not Endpoint.MESSAGES:  # SGLang's has no priority
            body["priority"] = sent
            raw = orjson.dumps(body)
    if state.admission_metrics is not None:
        # Decided first, so a follow-up waits for room on its holder; a first turn waits for
        # room anywhere. One that waited is decided again on the cluster as it is now: a
        # follow-up stays with its holder unless the policy would move it anyway.
        follow_up = turn > 0
        bound = first.decision.worker if follow_up else None
        pages = features.page_hashes if follow_up else ()
        ticket = await _admit(
            state, request, bound, follow_up, features.prompt_len, priority, pages
        )
    try:
        if ticket is not None and ticket.waited_s > 0:
            decided = await _decide(state, router, features, model, probed, l3, later)
        if isinstance(decided, Pair):
            assert state.pd is not None  # a pair is decided only under PD
            state.metrics.routed(label, decided.prefill.decision.reason)
            return await state.pd.dispatch(request, endpoint.value, body, decided, started, label)
        state.metrics.routed(label, decided.decision.reason)
        stream = body.get("stream") is True
        return await state.proxy.dispatch(
            request, endpoint.value, raw, decided, started, label, stream
        )
    finally:
        if ticket is not None:
            # where slots are kept, under the prompt's last full page: the next turn holds it
            ticket.release(features.page_hashes[-1] if features.page_hashes else None)


async def _decide(
    state: RouterState,
    router: Router,
    features: RequestFeatures,
    model: str | None,
    probed: Mapping[str, tuple[int, int]] | None,
    l3: int | None,
    later: asyncio.Future[int | None] | None = None,
    clock: _Stages | None = None,
) -> Pair | Routed:
    """The policy's placement (a prefill/decode pair under PD), in its trace span; no healthy
    worker is a 503. With `later` (the global tier still being asked), it waits for the answer
    only where the policy's decision turns on it; the wait is the clock's l3 stage. Called again
    for a request that waited for admission."""
    try:
        with tracing.span("route") as span:
            if state.pd is not None:
                pair = state.pd.route(features, model, probed, l3)
                if tracing.enabled:
                    span.set_many(pd_decision_attributes(pair, state.pd))
                return pair
            routed = None if later is None else router.route_beside(features, model, probed, later)
            if routed is None:
                if later is not None:
                    l3 = await asyncio.shield(later)  # a request cancelled meanwhile leaves it
                    later = None
                    if clock is not None:
                        clock.done("l3")
                routed = router.route(features, model, probed, l3)
            if tracing.enabled:
                span.set_many(decision_attributes(routed, router.policy.name))
            return routed
    except NoWorkerAvailable:
        raise no_worker() from None


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


ADMISSION: web.RequestKey[Ticket] = web.RequestKey("smetric_admission")
ADMISSION_ORDER_HEADER = "x-smetric-admission-order"
ADMISSION_WAIT_HEADER = "x-smetric-admission-wait-ms"


async def _admit(
    state: RouterState,
    request: web.Request,
    worker: str | None,
    follow_up: bool,
    tokens: int = 0,
    priority: int = 0,
    pages: Sequence[int] = (),
) -> Ticket | None:
    """Charge the tenant's rate limits, then wait for room (None: no admission queue); a
    refusal is answered 429. A request the queue sheds gets its charge back. pages: a
    follow-up's prompt pages, to take a slot kept for its conversation."""
    metrics = state.admission_metrics
    if metrics is None:
        return None
    tenant = tenant_of(request)
    name = tenant.name if tenant is not None else ANONYMOUS
    label = kind(follow_up)
    if state.limits is not None:
        refused = state.limits.charge(name, tokens)
        if refused is not None:
            metrics.shed.labels(RATE_LIMIT, label, name).inc()
            raise rate_limited(name, refused)
    if state.admission is None:
        metrics.admitted.labels(label, "no", name).inc()
        metrics.wait.labels(label, name).observe(0.0)
        return None
    try:
        ticket = await state.admission.admit(worker, follow_up, name, priority, pages)
    except Shed as e:
        if state.limits is not None:
            state.limits.refund(name, tokens)
        raise refusal(e, e.retry_after) from None
    except asyncio.CancelledError:
        if state.limits is not None:
            state.limits.refund(name, tokens)
        raise
    request[ADMISSION] = ticket
    return ticket


def _priority(body: dict[str, Any], tenant: Tenant | None) -> int:
    """The body's `priority` (SGLang's field: higher goes first; 0 when absent), within the
    tenant's max_priority (a 400 past it). The body is not changed."""
    p = body.get("priority")
    if p is None:
        return 0
    if type(p) is not int or p not in PRIORITY_RANGE:
        raise bad_request("'priority' must be an integer (signed 64-bit).", param="priority")
    if tenant is not None and tenant.max_priority is not None and p > tenant.max_priority:
        raise bad_request(
            f"'priority' {p} is above the highest this API key may ask for "
            f"({tenant.max_priority}).",
            param="priority",
        )
    return p


async def admission_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Which admission this was and how long it waited, for clients and tests to see the order."""
    ticket = request.get(ADMISSION)
    if ticket is not None:
        response.headers[ADMISSION_ORDER_HEADER] = str(ticket.order)
        response.headers[ADMISSION_WAIT_HEADER] = str(round(ticket.waited_s * 1000))


def _drop_thinking(state: RouterState, body: dict[str, Any], model: str | None) -> bool:
    """For workers without a reasoning parser, take out of a Messages body what they would
    refuse (features/anthropic_thinking.py), unless --anthropic-thinking reject. Returns whether
    the body changed."""
    if state.config.anthropic_thinking != "drop" or state.registry.can_reason(model):
        return False
    dropped = anthropic_thinking.drop_thinking(body)
    if dropped:
        state.metrics.dropped(dropped)
        log.debug("dropped %s from a Messages request: no reasoning parser", ", ".join(dropped))
    return bool(dropped)


async def handle_count_tokens(request: web.Request) -> web.Response:
    """Anthropic's count_tokens, answered here (router/api_messages.py says why)."""
    state = request.app[STATE]
    try:
        _, body = await read_json_object(request, state.config.max_body_bytes)
        model = _check_model(body, state.registry)
        if (
            state.config.anthropic_thinking == "reject"
            and anthropic_thinking.enables_reasoning(body)
            and not state.registry.can_reason(model)
        ):  # the workers' own answer
            raise bad_request(anthropic_thinking.REFUSAL)
        chat = state.router.features.messages_chat(body)
        return api_messages.count_tokens_reply(await state.router.prompt_length(chat))
    except FeatureError as e:
        return bad_request(str(e)).response()
    except RouterError as e:
        return e.response()


async def handle_response_by_id(request: web.Request) -> web.Response:
    """GET /v1/responses/{id}, POST /v1/responses/{id}/cancel: to the holder (api_responses)."""
    state = request.app[STATE]
    started = time.perf_counter()
    status = 499
    try:
        resp = await api_responses.by_id(
            state.response_ids,
            state.registry,
            state.session,
            request,
            upstream_auth_header(request),
            state.config.request_timeout_secs,
        )
        status = resp.status
        return resp
    except RouterError as e:
        status = e.status
        return e.response()
    finally:
        state.metrics.answered(api_responses.BY_ID_LABEL, status, time.perf_counter() - started)


async def handle_models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    data = [
        {"id": m, "object": "model", "created": state.started, "owned_by": "sglang"}
        for m in sorted(state.registry.models())
    ]
    return web.json_response({"object": "list", "data": data}, dumps=_dumps)


async def handle_health(request: web.Request) -> web.Response:
    # pid: which replica answered, under --processes N
    return web.json_response({"status": "ok", "pid": os.getpid()}, dumps=_dumps)


# A replica that has just started knows no worker's cache until each KV-event feed has replayed
# what its worker still buffers; ready before that, a balancer would send it follow-ups it places
# as first turns. It waits for that warm start, but only this long after its start: a feed that
# cannot connect must not keep every replica of a tier out of its balancer.
KV_WARM_WAIT_S = 15.0


def _warming(state: RouterState, workers: list[Worker]) -> int:
    """Healthy workers whose KV-event feed has not finished its first warm start."""
    if state.kv_feeds is None or time.monotonic() - state.started_at > KV_WARM_WAIT_S:
        return 0
    feeds = [state.kv_feeds.stats(w.url) for w in workers]
    return sum(f is not None and f.events_enabled is not False and not f.warmed for f in feeds)


def readiness(state: RouterState) -> tuple[bool, dict[str, Any]]:
    """Whether this router can route now, and the body of its /readiness answer."""
    workers = state.registry.healthy()
    body: dict[str, Any] = {"status": "ready", "healthy_workers": len(workers)}
    if state.drain.draining:  # a balancer takes this replica out while it drains
        body["status"] = "draining"
        return False, body
    # Under PD a request needs both sides.
    needed = [Role.PREFILL, Role.DECODE] if state.pd is not None else [Role.WORKER]
    ready = all(any(w.role is r for w in workers) for r in needed)
    warming = _warming(state, workers) if ready else 0
    if not ready:
        body["status"] = "not ready"
    elif warming:
        body["status"] = "warming KV views"
        body["warming_workers"] = warming
    return ready and not warming, body


async def handle_readiness(request: web.Request) -> web.Response:
    ok, body = readiness(request.app[STATE])
    return web.json_response(body, status=200 if ok else 503, dumps=_dumps)


async def handle_metrics(request: web.Request) -> web.Response:
    body = request.app[STATE].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def handle_list_workers(request: web.Request) -> web.Response:
    state = request.app[STATE]
    workers = state.registry.describe()
    if state.hits is not None:
        # What the router believes each worker caches, from its KV events (pages per tier).
        for w in workers:
            if w["role"] == Role.DECODE.value:
                continue
            st = state.hits.stats(w["url"])
            w["kv_pages"] = {"gpu": st.gpu_pages, "host": st.host_pages}
            # The feed behind those pages: is it up, and has it been failing?
            feed = state.kv_feeds.stats(w["url"]) if state.kv_feeds is not None else None
            if feed is not None:
                w["kv_feed"] = {"connected": feed.connected, "stalls": feed.stalls,
                                "reconnects": feed.reconnects, "refused": feed.refused}  # fmt: skip
    return web.json_response({"workers": workers}, dumps=_dumps)


async def handle_prefix_match(request: web.Request) -> web.Response:
    """What the router's KV-event index says each worker caches of given token ids, per tier, in
    the shape of the patched workers' /smetric/prefix_match (device; host = device or host); with
    --l3-view, also `l3`: per prompt, the leading tokens its L3 source says the global tier holds
    ("model" in the body names the key prefix, as for a generation request)."""
    state = request.app[STATE]
    try:
        if state.hits is None:
            raise RouterError(409, "The router runs without a KV-event index (--cache-view "
                              "probe or --no-kv-events): ask the workers.")  # fmt: skip
        _, body = await read_json_object(request, state.config.max_body_bytes)
        ids: Any = body.get("input_ids")
        batch = isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
        prompts: list[Any] = ids if batch else [ids]
        if not all(isinstance(p, list) and all(type(t) is int for t in p) for p in prompts):
            raise bad_request("'input_ids' must be a list of token ids, or a list of such lists.",
                              param="input_ids")  # fmt: skip
        page_size = state.registry.page_size or DEFAULT_PAGE_SIZE
        model = _check_model(body, state.registry)
        results, l3 = [], []
        for prompt in prompts:
            # the same features a /generate of these ids gets (digests too, with --l3-view master)
            f = state.router.features.from_generate({"input_ids": prompt})
            hits = state.hits.match(f.page_hashes, page_size)
            results.append({w: {"device": g, "host": h} for w, (g, h) in hits.items()})
            if state.l3 is not None:
                l3.append(await state.router.l3_lookup(f, model))
    except RouterError as e:
        return e.response()
    except FeatureError as e:  # ids a /generate would be refused for (empty, out of range)
        return bad_request(str(e), param="input_ids").response()
    out: dict[str, Any] = {"page_size": page_size, "results": results}
    if state.l3 is not None:
        out["l3"] = l3  # per prompt: leading tokens in the global tier, null = unknown
    return web.json_response(out, dumps=_dumps)


async def handle_add_worker(request: web.Request) -> web.Response:
    state = request.app[STATE]
    try:
        _, body = await read_json_object(request, 64 * 1024)
        spec = _worker_spec(body, state.config.pd_disaggregation)
        try:
            w = await state.registry.add(spec)
        except KeyError:
            msg = f"worker {spec.url} is already registered"
            raise RouterError(409, msg, param="url") from None
        except ValueError as e:  # WorkerRejected included
            raise bad_request(str(e), param="url") from None
    except RouterError as e:
        return e.response()
    now = time.monotonic()
    return web.json_response({"worker": state.registry.describe_one(w, now)}, dumps=_dumps)


def _worker_spec(body: dict[str, Any], pd: bool) -> WorkerSpec:
    """{"url"}, and under PD {"url", "role": "prefill"|"decode"[, "bootstrap_port"]}."""
    url, role, port = body.get("url"), body.get("role"), body.get("bootstrap_port")
    if not isinstance(url, str):
        raise bad_request("'url' (string) is required.", param="url")
    allowed = ("prefill", "decode") if pd else ("worker", None)
    if role not in allowed:
        mode = "PD disaggregation" if pd else "a colocated router"
        want = "'prefill' or 'decode'" if pd else "absent"
        raise bad_request(f"'role' must be {want} under {mode}.", param="role")
    if port is not None and (not isinstance(port, int) or isinstance(port, bool)):
        raise bad_request("'bootstrap_port' must be an integer.", param="bootstrap_port")
    try:
        return WorkerSpec(url, Role(role or "worker"), port)
    except ValueError as e:
        raise bad_request(str(e), param="url") from None


async def handle_remove_worker(request: web.Request) -> web.Response:
    state = request.app[STATE]
    try:
        url = request.query.get("url")
        if url is None and request.can_read_body:
            _, body = await read_json_object(request, 64 * 1024)
            url = body.get("url") if isinstance(body.get("url"), str) else None
        if url is None:
            raise bad_request('give the worker as ?url= or a JSON body {"url": ...}', "url")
        try:
            url = normalize_url(url)
        except ValueError as e:
            raise bad_request(str(e), param="url") from None
        if await state.registry.remove(url) is None:
            raise RouterError(404, f"worker {url} is not registered", param="url")
    except RouterError as e:
        return e.response()
    return web.json_response({"removed": url}, dumps=_dumps)


async def handle_flush_cache(request: web.Request) -> web.Response:
    state = request.app[STATE]
    workers = list(state.registry.workers.values())
    timeout = aiohttp.ClientTimeout(total=state.config.request_timeout_secs)

    async def flush(url: str) -> tuple[int, str]:
        try:
            async with state.session.post(
                url + "/flush_cache",
                params=request.query,
                timeout=timeout,
                headers=state.config.worker_headers(),
            ) as resp:
                return resp.status, (await resp.read()).decode(errors="replace")
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            return 502, f"unreachable: {e or type(e).__name__}"

    results = await asyncio.gather(*(flush(w.url) for w in workers))
    # The text tree's guess of a flushed cache is empty too; so are the pages of requests that
    # ended (SGLang flushes only an idle worker, so none is still in flight there).
    for w, (status, _) in zip(workers, results, strict=True):
        if status == 200:
            state.forget_guesses(w.url)
    failures = [s for s, _ in results if s != 200]
    per_worker = zip(workers, results, strict=True)
    body = {"results": {w.url: {"status": s, "body": b} for w, (s, b) in per_worker}}
    return web.json_response(body, status=max(failures, default=200), dumps=_dumps)


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


# Assembly ------------------------------------------------------------------------------------


def build_app(state: RouterState) -> web.Application:
    app = web.Application(
        client_max_size=state.config.max_body_bytes,
        # outermost first: the span covers the refusals too
        middlewares=[*_tracing_middleware(), front_door(state.auth)],
    )
    app[STATE] = state

    async def on_startup(_: web.Application) -> None:
        await state.start()

    async def on_cleanup(_: web.Application) -> None:
        await state.stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    if state.admission is not None:
        app.on_response_prepare.append(admission_headers)
    if state.tenants is not None:
        app.on_response_prepare.append(tenant_header)
    # every route gets the Expect handler that cannot fail (http_guards)
    guard = expect_continue
    for endpoint in Endpoint:
        app.router.add_post(endpoint.value, generation_handler(endpoint), expect_handler=guard)
    app.router.add_put(
        Endpoint.GENERATE.value, generation_handler(Endpoint.GENERATE), expect_handler=guard
    )
    app.router.add_post(api_messages.COUNT_TOKENS, handle_count_tokens, expect_handler=guard)
    by_id = api_responses.PREFIX + "/{response_id}"
    app.router.add_get(by_id, handle_response_by_id, expect_handler=guard)
    app.router.add_post(by_id + "/cancel", handle_response_by_id, expect_handler=guard)
    app.router.add_get("/v1/models", handle_models, expect_handler=guard)
    app.router.add_get("/health", handle_health, expect_handler=guard)
    app.router.add_get("/liveness", handle_health, expect_handler=guard)
    app.router.add_get("/readiness", handle_readiness, expect_handler=guard)
    app.router.add_get("/metrics", handle_metrics, expect_handler=guard)
    app.router.add_get("/workers", handle_list_workers, expect_handler=guard)
    app.router.add_post("/workers", handle_add_worker, expect_handler=guard)
    app.router.add_delete("/workers", handle_remove_worker, expect_handler=guard)
    # POST only: a link cannot flush
    app.router.add_post("/flush_cache", handle_flush_cache, expect_handler=guard)
    app.router.add_post("/smetric/prefix_match", handle_prefix_match, expect_handler=guard)
    # the live page (open: static, no data) and its data (admin): router/dashboard.py
    app.router.add_get("/dashboard", handle_page, expect_handler=guard)
    app.router.add_get("/dashboard/data", data_handler(lambda r: r.app[STATE].sampler),
                       expect_handler=guard)  # fmt: skip
    add_catch_all(app)
    hide_server(app)
    quiet_client_faults()
    return app


def front_door(policy: AuthPolicy) -> Middleware:
    """Auth's refusals, then any error answer on a Messages path in Anthropic's shape. One
    middleware for both: each layer of aiohttp's chain costs every request."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = auth_refusal(policy, request)
        resp = refused if refused is not None else await handler(request)
        return api_messages.shape_error(request, resp)

    return middleware


def _tracing_middleware() -> list[Any]:
    """The server span of each request, with --enable-trace (set up before the app is built)."""
    if not tracing.enabled:
        return []
    from smetric_router.router.otel_trace import server_span

    return [server_span]


def metrics_app(state: RouterState) -> web.Application:
    """The --prometheus-port server: /metrics only."""
    app = web.Application()
    app[STATE] = state
    app.router.add_get("/metrics", handle_metrics, expect_handler=expect_continue)
    add_catch_all(app)
    hide_server(app)
    return app
