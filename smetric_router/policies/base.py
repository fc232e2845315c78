"""The policy interface, its parameters and the one registration point."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from smetric_router.core.flags import Flag, option
from smetric_router.core.types import (
    ClusterView,
    Decision,
    NoWorkerAvailable,
    RequestFeatures,
    WorkerView,
)

# The argument group the router lists --l3-aware-guard in (its other L3 flags are there).
L3_FLAG_GROUP = "global KV tier (L3)"


@dataclass(frozen=True, slots=True)
class PolicyParams:
    """Tunables of all policies (defaults from the paper and from sglang-router 0.3.2), with the
    flags the router and the simulator set them by."""

    overload: float = option(
        2.0,
        Flag(
            "--overload",
            "smetric-paper: a follow-up is not sent to its cache holder when that worker's load "
            "exceeds OVERLOAD x the mean load (it is balanced instead); the paper's OVERLOAD; "
            "inf = never (smetric bounds moves by --move-cost-ratio instead)",
        ),
    )
    # SMetric (every smetric-* but smetric-paper): its overload guard in units of cost, which mean
    # the same at any cluster size (policies/smetric.py says why and what it measured).
    move_cost_ratio: float = option(
        2.0,
        Flag(
            "--move-cost-ratio",
            "smetric: a follow-up leaves the worker holding its cache when staying would cost "
            "more than MOVE_COST_RATIO x the cheapest move, a worker's cost being its "
            "unprefilled tokens + the tokens the request would prefill there x (its load + 1) "
            "(smetric-inflight and its first-turn variants: without the unprefilled tokens); "
            "inf = never moved for load (smetric still moves a follow-up the global tier holds "
            "where its delay is least). "
            "smetric-ftband: a first turn goes only to a worker whose load + 1 is within "
            "MOVE_COST_RATIO x the least loaded's",
        ),
    )
    hit_ratio: float = option(
        0.5,
        Flag(
            "--hit-ratio",
            "smetric: a follow-up whose best cached prefix is at most HIT_RATIO x its history "
            "is treated as evicted and balanced; the paper's HIT_RATIO",
        ),
    )
    # SMetric: a history that left the local tiers but is held in L3 is fetchable, not evicted:
    # the follow-up stays with its best local holder, which loads the rest from L3, instead of
    # being balanced (where the whole history would be fetched). Needs the router's L3 view. Off
    # by default: it saves L3 traffic but keeps sessions on the workers whose caches overflowed,
    # which cost tail TTFT in benchmarks/results/l3_guard.md.
    l3_aware: bool = option(
        False,
        Flag(
            "--l3-aware-guard",
            "smetric: a history evicted from the local tiers but held in L3 stays with its best "
            "local holder, which loads the rest from L3 (reason sticky-l3), instead of being "
            "balanced as the paper's guard does: less L3 traffic, more load on the workers that "
            "evicted (worse tail TTFT in benchmarks/results/l3_guard.md); needs --l3-view",
            group=L3_FLAG_GROUP,
        ),
    )
    # Bailian: weight of the miss term. Unpublished; 0.6 gives the paper's Bailian imbalance
    # relative to load-balance-only (benchmarks/results/bailian_lambda.md); from 0.7 a shared
    # template's hit outweighs any load and sessions pile on the template's holders.
    bailian_lambda: float = option(
        0.6,
        Flag(
            "--bailian-lambda",
            "bailian: weight of the cache-miss term against the load term (unpublished; chosen "
            "in benchmarks/results/bailian_lambda.md)",
        ),
    )
    cache_threshold: float = option(
        0.3,
        Flag(
            "--cache-threshold",
            "cache_aware (as sglang-router): minimum text-match ratio to follow the tree",
        ),
    )
    balance_abs_threshold: float = option(
        64,
        Flag(
            "--balance-abs-threshold",
            "cache_aware (as sglang-router): load gap (max-min) above which the cluster counts "
            "as imbalanced",
        ),
    )
    balance_rel_threshold: float = option(
        1.5,
        Flag(
            "--balance-rel-threshold",
            "cache_aware (as sglang-router): load ratio (max/min) above which the cluster "
            "counts as imbalanced",
        ),
    )

    def __post_init__(self) -> None:
        if self.overload <= 0:
            raise ValueError(f"overload must be > 0, got {self.overload}")
        if not self.move_cost_ratio >= 1:
            raise ValueError(f"move_cost_ratio must be >= 1, got {self.move_cost_ratio}")
        if not 0 <= self.hit_ratio <= 1:
            raise ValueError(f"hit_ratio must be in [0, 1], got {self.hit_ratio}")
        if not 0 <= self.bailian_lambda <= 1:
            raise ValueError(f"bailian_lambda must be in [0, 1], got {self.bailian_lambda}")


class Policy(Protocol):
    """A pure function of (request features, cluster view) -> decision with a reason.

    Policies never do I/O and never mutate their inputs or themselves, so the same object runs in
    the router, against emulated workers and in the simulator.
    """

    @property
    def name(self) -> str: ...

    @property
    def uses_text_tree(self) -> bool: ...

    def needs_l3(self, features: RequestFeatures, view: ClusterView) -> bool:
        """Whether decide() on this view (its l3_hit None: the tier's answer not in yet) can
        come out differently once the global tier's hit is known. The router asks the master
        beside every request and waits for the answer before deciding only where this says so;
        elsewhere it decides on this very view, so the decision is the one the answer would have
        given."""
        ...

    def decide(self, features: RequestFeatures, view: ClusterView) -> Decision: ...


PolicyFactory = Callable[[PolicyParams], Policy]
_REGISTRY: dict[str, PolicyFactory] = {}


def register(name: str) -> Callable[[PolicyFactory], PolicyFactory]:
    def wrap(factory: PolicyFactory) -> PolicyFactory:
        if name in _REGISTRY:
            raise ValueError(f"policy {name!r} registered twice")
        _REGISTRY[name] = factory
        return factory

    return wrap


def policy_names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def registered_in(name: str) -> str:
    """The module that registers the policy: with its class's module, the policy's own source (a
    variant may register another policy's class with other settings, e.g. smetric_fetch.py)."""
    _load_builtin()
    return _REGISTRY[name].__module__


def make_policy(name: str, params: PolicyParams | None = None) -> Policy:
    _load_builtin()
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown policy {name!r}; choose one of {', '.join(sorted(_REGISTRY))}"
        ) from None
    return factory(params or PolicyParams())


def _load_builtin() -> None:
    # Importing the package registers every built-in policy exactly once.
    import smetric_router.policies.builtin  # noqa: F401


# Helpers shared by policies -------------------------------------------------------------------


def healthy_or_raise(view: ClusterView) -> tuple[WorkerView, ...]:
    workers = view.healthy()
    if not workers:
        raise NoWorkerAvailable("no healthy worker")
    return workers


def lowest(workers: Sequence[WorkerView], scores: Sequence[float]) -> list[WorkerView]:
    """The workers tied on the lowest score (within float noise), in view order."""
    best = min(scores)
    tie = best + 1e-9 * max(1.0, abs(best))
    return [w for w, s in zip(workers, scores, strict=True) if s <= tie]


def rr_argmin(workers: Sequence[WorkerView], scores: Sequence[float], tick: int) -> WorkerView:
    """The lowest-scoring worker; ties are broken round-robin by the view's tick."""
    ties = lowest(workers, scores)
    return ties[tick % len(ties)]


def least_load(workers: Sequence[WorkerView], tick: int) -> WorkerView:
    return rr_argmin(workers, [w.load for w in workers], tick)


def least_recompute(
    workers: Sequence[WorkerView], features: RequestFeatures, tick: int
) -> WorkerView:
    """The worker where the request recomputes least, weighted by what is already in its way:
    (prompt - local hit) x (load + 1), ties round-robin (lmetric-inflight's score)."""
    return rr_argmin(workers, [recompute_cost(w, features) for w in workers], tick)


def recompute_cost(worker: WorkerView, features: RequestFeatures) -> float:
    """(prompt - local hit) x (load + 1): the tokens the request would prefill on this worker,
    weighted by the load already there."""
    return max(features.prompt_len - worker.hit, 0) * (worker.load + 1)
