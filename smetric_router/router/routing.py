"""One decision per request, in one pass: features once, one view snapshot, one decide (with
--cache-view probe, one gathered probe round between the features and the snapshot).

A retry re-decides on the same features and the same snapshot with the failed workers marked
unhealthy, so a retry never recomputes features or re-reads the cluster.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import random
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Protocol, TypeVar

from smetric_router.cluster.inflight import Hold, InflightPrefixes
from smetric_router.core import tracing
from smetric_router.core.mooncake_keys import key_prefix
from smetric_router.core.types import ClusterView, Decision, RequestFeatures, WorkerView
from smetric_router.features.budget import Budget, Offload, PromptTooLong
from smetric_router.features.session_hint import session_hint
from smetric_router.policies import Policy
from smetric_router.router import token_limits
from smetric_router.router.errors import RouterError
from smetric_router.router.metrics import RouterMetrics
from smetric_router.router.probe import Prober
from smetric_router.router.workers import Role, Worker, WorkerRegistry

log = logging.getLogger(__name__)

T = TypeVar("T")

# Used only until some worker reports its page size (no worker reachable yet, or none reports one).
DEFAULT_PAGE_SIZE = 16
# A request with more characters than this to tokenize is extracted in a thread, so the event
# loop keeps serving (the tokenizer releases the GIL on such texts): on a loaded 2-core machine
# the hop costs ~40 us and tokenizing 8K characters of code ~2.9 ms, but a chat sent there is
# rendered twice (0.1-0.4 ms), so agent follow-ups with a few KB of new text stay here.
INLINE_CHARS = 8192
# One thread: a huge prompt's tokenizing holds its memory, so they are read one at a time.
_OFF_LOOP = ThreadPoolExecutor(max_workers=1, thread_name_prefix="smetric-features")


class Endpoint(str, Enum):
    CHAT = "/v1/chat/completions"
    COMPLETION = "/v1/completions"
    GENERATE = "/generate"
    # Anthropic Messages: routed by the chat body SGLang builds of it (router/api_messages.py)
    MESSAGES = "/v1/messages"
    # OpenAI Responses: by the chat body SGLang builds of it, or to the holder of
    # previous_response_id (router/api_responses.py)
    RESPONSES = "/v1/responses"


class HitIndex(Protocol):
    """cluster.kv_index.KvIndex as the router uses it."""

    def match(
        self, page_hashes: Sequence[int], page_size: int
    ) -> Mapping[str, tuple[int, int]]: ...

    def stats(self, worker: str) -> PageCounts: ...


class PageCounts(Protocol):
    @property
    def gpu_pages(self) -> int: ...

    @property
    def host_pages(self) -> int: ...


class L3Source(Protocol):
    """Where the global tier's hits come from: cluster.l3_view.MasterL3 or EventsL3."""

    @property
    def name(self) -> str: ...

    async def lookup(self, prefix: str, features: RequestFeatures) -> int | None: ...


class TextTree(Protocol):
    """cluster.text_tree as the router uses it (cache_aware baseline only)."""

    def match(self, text: str) -> Mapping[str, int]: ...

    def insert(self, text: str, worker: str) -> None: ...

    def size(self, worker: str) -> int: ...

    def remove_worker(self, worker: str) -> None: ...


class Features(Protocol):
    """features.extract.FeatureExtractor as the router uses it."""

    def from_chat(self, body: dict[str, Any], budget: Budget = ...) -> RequestFeatures: ...

    def from_completion(
        self,
        body: dict[str, Any],
        headers: Mapping[str, str] | None = None,
        budget: Budget = ...,
    ) -> RequestFeatures: ...

    def from_generate(
        self,
        body: dict[str, Any],
        headers: Mapping[str, str] | None = None,
        budget: Budget = ...,
    ) -> RequestFeatures: ...

    def prompt_token_ids(self, body: Mapping[str, Any], budget: Budget = ...) -> list[int]: ...

    def messages_chat(self, body: Mapping[str, Any]) -> dict[str, Any]: ...

    def responses_chat(self, body: Mapping[str, Any]) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Routed:
    features: RequestFeatures
    view: ClusterView
    decision: Decision
    # The global tier's hit while it is still being asked (Router.l3_later): the view says
    # l3_hit None ("unknown") until Router.settle() puts the answer in.
    l3: asyncio.Future[int | None] | None = None


class Router:
    def __init__(
        self,
        policy: Policy,
        registry: WorkerRegistry,
        metrics: RouterMetrics,
        features_for: Callable[[int], Features],
        hits: HitIndex | None = None,
        text_tree: TextTree | None = None,
        role: Role = Role.WORKER,
        prober: Prober | None = None,
        l3: L3Source | None = None,
        l3_key_prefix: str | None = None,
        inflight: InflightPrefixes | None = None,
        context_length: int | None = None,
        session_hints: bool = True,
    ) -> None:
        """Decides among the registry's workers of `role` (one Router per PD side). With a
        prober, hits come from probing the workers (see probe()), not from `hits`; with an L3
        source, each worker's view carries the global tier's hit too (see l3_lookup()). With
        `inflight`, the pages of requests dispatched (hold()) and not yet ended (release()) count
        as held by their worker too (cluster/inflight.py). context_length overrides what the
        workers report (router/token_limits.py). session_hints: hinted() adds the agent's
        session id when the request names one (features/session_hint.py), for the policy to read
        as a hint."""
        self.policy = policy
        self.role = role
        self.registry = registry
        self.metrics = metrics
        self._features_for = features_for
        self._features: tuple[int, Features] | None = None
        self.hits = hits
        self.text_tree = text_tree if policy.uses_text_tree else None
        self.prober = prober
        self.l3 = l3
        self.l3_key_prefix = l3_key_prefix
        self.inflight = inflight
        self.context_override = context_length
        self.session_hints = session_hints
        self._tick = itertools.count()

    @property
    def features(self) -> Features:
        """The extractor for the cluster's page size (fixed once the first worker reports it)."""
        page_size = self.registry.page_size or DEFAULT_PAGE_SIZE
        if self._features is None or self._features[0] != page_size:
            self._features = (page_size, self._features_for(page_size))
        return self._features[1]

    def context_length(self, model: str | None) -> int | None:
        """The context a request for model must fit: the override, else the smallest one its
        candidate workers report; None when unknown."""
        if self.context_override is not None:
            return self.context_override
        reported = [w.context_length for w in self._serving(model) if w.context_length]
        return min(reported, default=None)

    async def extract(
        self,
        endpoint: Endpoint,
        body: dict[str, Any],
        headers: Mapping[str, str],
        model: str | None = None,
    ) -> RequestFeatures:
        """The request's features, once its token limits are checked (router/token_limits.py): a
        completion budget past the context is refused before the prompt is read, a prompt that
        reaches the context as soon as a prefix of it shows that."""
        asked = token_limits.requested_tokens(endpoint.value, body)
        context = self.context_length(model)
        token_limits.check_budget(asked, context)
        try:
            features = await self._extract(endpoint, body, headers, Budget(context, INLINE_CHARS))
            if context is not None and features.prompt_len >= context:  # token ids, appended
                raise PromptTooLong(features.prompt_len, context, at_least=False)
        except PromptTooLong as e:
            raise token_limits.too_long(str(e), endpoint.value, body) from None
        token_limits.check_total(asked, features.prompt_len, context)
        return features

    async def _extract(
        self,
        endpoint: Endpoint,
        body: dict[str, Any],
        headers: Mapping[str, str],
        budget: Budget,
    ) -> RequestFeatures:
        run = functools.partial(self._extract_now, self.features, endpoint, body, headers)
        return await self._tokenizing(run, budget)

    @staticmethod
    async def _tokenizing(run: Callable[[Budget], T], budget: Budget) -> T:
        """run(budget) on the loop when little is to be tokenized, else in the thread (Offload).
        A small request never waits behind a big one: the extractor is thread-safe, so a
        follow-up is read on the loop even while a long first turn is tokenized in the thread
        (queued behind such turns, agents' follow-ups waited 0.4-0.6 s on a loaded 2-core
        machine: benchmarks/results/README.md)."""
        try:
            return run(budget)
        except Offload:
            pass
        off_loop = replace(budget, inline_chars=None)
        run = tracing.in_context(run)  # its spans under this request's (--enable-trace)
        return await asyncio.get_running_loop().run_in_executor(_OFF_LOOP, run, off_loop)

    @staticmethod
    def _extract_now(
        features: Features,
        endpoint: Endpoint,
        body: dict[str, Any],
        headers: Mapping[str, str],
        budget: Budget,
    ) -> RequestFeatures:
        if endpoint is Endpoint.CHAT:
            return features.from_chat(body, budget)
        if endpoint is Endpoint.COMPLETION:
            return features.from_completion(body, headers, budget)
        return features.from_generate(body, headers, budget)

    async def prompt_length(self, chat: dict[str, Any]) -> int:
        """A chat body's prompt tokens, as the workers count them (count_tokens: no limits)."""
        run = functools.partial(self.features.from_chat, chat)
        return (await self._tokenizing(run, Budget(None, INLINE_CHARS))).prompt_len

    def hinted(
        self, features: RequestFeatures, headers: Mapping[str, str], body: Mapping[str, Any]
    ) -> RequestFeatures:
        """features with the agent's session id when the request names one. body: the request
        as the client sent it (a Messages or Responses body, not the chat body it is routed as),
        where agents put it."""
        hint = session_hint(headers, body) if self.session_hints else None
        return features if hint is None else replace(features, session_hint=hint)

    async def probe(
        self, body: dict[str, Any], model: str | None
    ) -> Mapping[str, tuple[int, int]] | None:
        """Probe mode only (None otherwise): the healthy candidates' cached prefix of this prompt,
        asked in one gathered round. Tokenizing the whole prompt is the price of this mode."""
        if self.prober is None:
            return None
        urls = [w.url for w in self._serving(model) if w.healthy]
        if not urls:
            return {}
        ids = functools.partial(self.features.prompt_token_ids, body)
        return await self.prober.hits(await self._tokenizing(ids, Budget(None, INLINE_CHARS)), urls)

    async def l3_lookup(self, features: RequestFeatures, model: str | None) -> int | None:
        """Leading prompt tokens in the global tier: 0 without an L3 view, None when unknown
        (the master is unreachable or slow, or the key prefix cannot be told)."""
        if self.l3 is None or not features.page_hashes:
            return 0
        prefix = self.l3_key_prefix
        if prefix is None:
            served = self.registry.models()
            name = model or (next(iter(served)) if len(served) == 1 else None)
            if name is None:
                return None
            prefix = key_prefix(name)
        return await self.l3.lookup(prefix, features)

    def l3_later(
        self, features: RequestFeatures, model: str | None
    ) -> asyncio.Future[int | None] | None:
        """The global tier's hit asked beside the request rather than before its decision:
        waiting for the master held every decision up (46-65 ms on a loaded 2-core machine,
        benchmarks/results/README.md), and most decisions do not turn on its answer
        (route_beside()); it is wanted for the response's headers and the metrics (settle()).
        None where there is nothing to ask."""
        if self.l3 is None or not features.page_hashes:
            return None
        lookup = asyncio.ensure_future(self.l3_lookup(features, model))
        lookup.add_done_callback(_retrieve)  # a request that ends first never reads it
        return lookup

    async def settle(self, routed: Routed) -> Routed:
        """routed with the answer of its global-tier lookup in the view (l3_later), once it has
        come (within the L3 view's budget); the chosen worker's prefix is counted by tier then,
        as decide() counts it for a decision made with the answer."""
        if routed.l3 is None:
            return routed
        l3 = await asyncio.shield(routed.l3)  # a request cancelled meanwhile leaves it running
        settled = Routed(routed.features, routed.view.answered(l3), routed.decision)
        self._count_prefix(settled.view, settled.decision)
        return settled

    def hold(self, worker: str, features: RequestFeatures) -> Hold | None:
        """The request is being sent to `worker`: its pages count as held there (None: no
        in-flight view). Call before the first await after the decision, so that a request routed
        right after this one sees them."""
        if self.inflight is None or not features.page_hashes:
            return None
        return self.inflight.hold(worker, features.page_hashes)

    def release(self, hold: Hold | None, *, ran: bool) -> None:
        """The request ended; ran: the worker took it (so it caches its pages), not refused."""
        if hold is not None and self.inflight is not None:
            self.inflight.release(hold, grace=ran)

    def route(
        self,
        features: RequestFeatures,
        model: str | None,
        probed: Mapping[str, tuple[int, int]] | None = None,
        l3: int | None = 0,
    ) -> Routed:
        """l3: the global tier's hit, known (l3_lookup()); see route_beside() for a decision
        made while it is still being asked."""
        return self._route_on(features, self.snapshot(features, model, probed, l3), None)

    def route_beside(
        self,
        features: RequestFeatures,
        model: str | None,
        probed: Mapping[str, tuple[int, int]] | None,
        later: asyncio.Future[int | None],
    ) -> Routed | None:
        """route() while l3_later()'s lookup is still out: the decision on the cluster as it is
        now, or None where the policy says its decision there could turn on the answer
        (Policy.needs_l3); then the caller waits for it and calls route() with it. Decided on the
        same view the policy was asked about, so it is the decision the answer would have given."""
        view = self.snapshot(features, model, probed, None)
        if self.policy.needs_l3(features, view):
            return None
        return self._route_on(features, view, later)

    def _route_on(
        self,
        features: RequestFeatures,
        view: ClusterView,
        later: asyncio.Future[int | None] | None,
    ) -> Routed:
        decision = self.decide(features, view, counted=later is None)
        if self.text_tree is not None and features.text:
            self.text_tree.insert(features.text, decision.worker)
        return Routed(features, view, decision, later)

    def route_to(self, worker: str, model: str | None, reason: str) -> Routed:
        """A request that only `worker` can serve (it holds state the request continues): no
        features, a view of that worker alone (so no retry goes elsewhere)."""
        page_size = self.registry.page_size or DEFAULT_PAGE_SIZE
        features = RequestFeatures(0, (), page_size, None, 0, model=model)
        view = self.snapshot(features, model)
        view = replace(view, workers=tuple(w for w in view.workers if w.url == worker))
        self.metrics.decided(reason, worker)
        return Routed(features, view, Decision(worker, reason))

    def reroute(self, routed: Routed, excluded: Collection[str]) -> Routed:
        workers = tuple(
            replace(w, healthy=False) if w.url in excluded else w for w in routed.view.workers
        )
        view = replace(routed.view, workers=workers, tick=next(self._tick))
        decision = self.decide(routed.features, view, counted=routed.l3 is None)
        return Routed(routed.features, view, decision, routed.l3)

    def decide(
        self, features: RequestFeatures, view: ClusterView, counted: bool = True
    ) -> Decision:
        """counted=False: the chosen worker's prefix is counted by settle() instead, once the
        global tier's part of it is known."""
        decision = self.policy.decide(features, view)
        self.metrics.decided(decision.reason, decision.worker)
        if counted:
            self._count_prefix(view, decision)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "decision worker=%s reason=%s turn=%s session=%s prompt=%d est_hit=%d loads=%s "
                "hits=%s l3=%s",
                decision.worker,
                decision.reason,
                features.turn,
                features.session_hint,
                features.prompt_len,
                features.est_hit,
                [w.load for w in view.workers],
                [w.hit for w in view.workers],
                [w.l3_hit for w in view.workers],
            )
        return decision

    def _count_prefix(self, view: ClusterView, decision: Decision) -> None:
        chosen = view.worker(decision.worker)
        if chosen is not None and self.role is not Role.DECODE:
            self.metrics.count_prefix(chosen.gpu_hit, chosen.hit, chosen.l3_hit)

    def snapshot(
        self,
        features: RequestFeatures,
        model: str | None,
        probed: Mapping[str, tuple[int, int]] | None = None,
        l3: int | None = 0,
    ) -> ClusterView:
        """probed: url -> (GPU hit, GPU-or-host hit) from probe(); else the KV-event index.
        l3: the global tier's hit from l3_lookup(), given to every worker that uses the tier."""
        candidates = self._serving(model)
        if not candidates:
            what = "worker" if self.role is Role.WORKER else f"{self.role.value} worker"
            raise RouterError(
                503, f"no {what} is registered", type_="server_error", code="no_worker_available"
            )
        hits: Mapping[str, tuple[int, int]] = {}
        if probed is not None:
            hits = probed
        elif self.hits is not None and features.page_hashes:
            hits = self.hits.match(features.page_hashes, features.page_size)
        pending: Mapping[str, int] = {}
        if self.inflight is not None and features.page_hashes:
            for w in candidates:  # an unhealthy worker may come back empty (restarted)
                if not w.healthy:
                    self.inflight.remove_worker(w.url)
            pending = self.inflight.match(features.page_hashes, features.page_size)
        text_hits: Mapping[str, int] = {}
        if self.text_tree is not None and features.text:
            text_hits = self.text_tree.match(features.text)
        max_age = self.registry.max_load_age
        now = time.monotonic()
        views = []
        raised = False
        for w in candidates:
            gpu_hit, local_hit = hits.get(w.url, (0, 0))
            if pending:  # in flight there: on its GPU once prefilled
                p = pending.get(w.url, 0)
                raised = raised or p > local_hit
                gpu_hit, local_hit = max(gpu_hit, p), max(local_hit, p)
            views.append(
                WorkerView(
                    url=w.url,
                    load=w.load(now, max_age),
                    running=w.running(now, max_age),
                    unprefilled=w.unprefilled_load(now, max_age),
                    recent_tokens=w.recent.value(now),
                    hit=local_hit,
                    gpu_hit=gpu_hit,
                    l3_hit=l3 if w.l3 else 0,
                    healthy=w.healthy,
                    breaker_open=not self.registry.takes_requests(w.url),
                    text_match=text_hits.get(w.url, 0),
                    text_tree_size=self.text_tree.size(w.url) if self.text_tree else 0,
                    prefill_only=self.role is Role.PREFILL,
                )
            )
        if raised:
            self.metrics.inflight_raised.inc()
        return ClusterView(
            workers=tuple(views), tick=next(self._tick), entropy=random.getrandbits(62)
        )

    def _serving(self, model: str | None) -> list[Worker]:
        workers = self.registry.of_role(self.role)
        if model is None:
            return workers
        # Workers that report no model names are assumed to serve whatever they are sent.
        return [w for w in workers if not w.models or model in w.models]


def _retrieve(lookup: asyncio.Future[int | None]) -> None:
    if not lookup.cancelled():
        lookup.exception()
