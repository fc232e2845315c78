"""KV-agnostic baselines: round_robin, random, power_of_two. Randomness comes from view.entropy."""

from __future__ import annotations

from dataclasses import dataclass

from smetric_router.core.types import ClusterView, Decision, RequestFeatures
from smetric_router.policies.base import PolicyParams, healthy_or_raise, register


@dataclass(frozen=True, slots=True)
class RoundRobin:
    params: PolicyParams
    name: str = "round_robin"
    uses_text_tree: bool = False

    def needs_l3(self, features: RequestFeatures, view: ClusterView) -> bool:
        return False  # never reads WorkerView.l3_hit

    def decide(self, features: RequestFeatures, view: ClusterView) -> Decision:
        workers = healthy_or_raise(view)
        return Decision(workers[view.tick % len(workers)].url, self.name)


@dataclass(frozen=True, slots=True)
class Random:
    params: PolicyParams
    name: str = "random"
    uses_text_tree: bool = False

    def needs_l3(self, features: RequestFeatures, view: ClusterView) -> bool:
        return False  # never reads WorkerView.l3_hit

    def decide(self, features: RequestFeatures, view: ClusterView) -> Decision:
        workers = healthy_or_raise(view)
        return Decision(workers[view.entropy % len(workers)].url, self.name)


@dataclass(frozen=True, slots=True)
class PowerOfTwo:
    params: PolicyParams
    name: str = "power_of_two"
    uses_text_tree: bool = False

    def needs_l3(self, features: RequestFeatures, view: ClusterView) -> bool:
        return False  # never reads WorkerView.l3_hit

    def decide(self, features: RequestFeatures, view: ClusterView) -> Decision:
        workers = healthy_or_raise(view)
        n = len(workers)
        if n == 1:
            return Decision(workers[0].url, self.name)
        i = view.entropy % n
        j = (i + 1 + (view.entropy // n) % (n - 1)) % n  # a second, distinct worker
        a, b = workers[i], workers[j]
        return Decision((b if b.load < a.load else a).url, self.name)


@register("round_robin")
def _rr(params: PolicyParams) -> RoundRobin:
    return RoundRobin(params)


@register("random")
def _random(params: PolicyParams) -> Random:
    return Random(params)


@register("power_of_two")
def _p2(params: PolicyParams) -> PowerOfTwo:
    return PowerOfTwo(params)
