"""The policy interface, its parameters and the one registration point."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from smetric_router.core.types import (
    ClusterView,
    Decision,
    NoWorkerAvailable,
    RequestFeatures,
    WorkerView,
)


@dataclass(frozen=True, slots=True)
class PolicyParams:
    """Tunables of all policies (defaults from the paper and from sglang-router 0.3.2)."""

    overload: float = 2.0  # SMetric: sticky target must carry load <= overload x mean load
    # SMetric: ...or at most this much above the mean. Request counts are small integers at light
    # load, and sessions that share a worker arrive there in step: the ratio alone then calls a
    # worker running 2 requests overloaded when the mean is 0.5. A worker batching tens of requests
    # does not notice two more, so only an excess beyond this slack counts (0 = the paper's rule).
    overload_slack: float = 2.0
    hit_ratio: float = 0.5  # SMetric: sticky only if best hit > hit_ratio x est_hit
    # SMetric: a history that left the local tiers but is held in L3 is fetchable, not evicted:
    # the follow-up stays with its best local holder, which loads the rest from L3, instead of
    # being balanced (where the whole history would be fetched). Needs the router's L3 view. Off
    # by default: it saves L3 traffic but keeps sessions on the workers whose caches overflowed,
    # which cost tail TTFT in benchmarks/results/l3_guard.md.
    l3_aware: bool = False
    # Bailian: weight of the miss term. Unpublished; 0.6 gives the paper's Bailian imbalance
    # relative to load-balance-only (benchmarks/results/bailian_lambda.md); from 0.7 a shared
    # template's hit outweighs any load and sessions pile on the template's holders.
    bailian_lambda: float = 0.6
    cache_threshold: float = 0.3  # cache_aware (sglang-router --cache-threshold)
    balance_abs_threshold: float = 64  # cache_aware (--balance-abs-threshold)
    balance_rel_threshold: float = 1.5  # cache_aware (--balance-rel-threshold)

    def __post_init__(self) -> None:
        if self.overload <= 0:
            raise ValueError(f"overload must be > 0, got {self.overload}")
        if self.overload_slack < 0:
            raise ValueError(f"overload_slack must be >= 0, got {self.overload_slack}")
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


def rr_argmin(workers: Sequence[WorkerView], scores: Sequence[float], tick: int) -> WorkerView:
    """The lowest-scoring worker; ties are broken round-robin by the view's tick."""
    best = min(scores)
    ties = [
        w for w, s in zip(workers, scores, strict=True) if s <= best + 1e-9 * max(1.0, abs(best))
    ]
    return ties[tick % len(ties)]


def least_load(workers: Sequence[WorkerView], tick: int) -> WorkerView:
    return rr_argmin(workers, [w.load for w in workers], tick)


def least_recompute(
    workers: Sequence[WorkerView], features: RequestFeatures, tick: int
) -> WorkerView:
    """The worker where the request recomputes least, weighted by what is already in its way:
    (prompt - local hit) x (load + 1), ties round-robin (lmetric-inflight's score)."""
    scores = [max(features.prompt_len - w.hit, 0) * (w.load + 1) for w in workers]
    return rr_argmin(workers, scores, tick)
