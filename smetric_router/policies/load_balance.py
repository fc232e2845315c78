"""Least load, KV-agnostic (request count; unprefilled tokens for PD prefill, as Dynamo does)."""

from __future__ import annotations

from dataclasses import dataclass

from smetric_router.core.types import ClusterView, Decision, RequestFeatures
from smetric_router.policies.base import PolicyParams, healthy_or_raise, least_load, register


@dataclass(frozen=True, slots=True)
class LoadBalance:
    params: PolicyParams
    name: str = "load_balance"
    uses_text_tree: bool = False

    def decide(self, features: RequestFeatures, view: ClusterView) -> Decision:
        return Decision(least_load(healthy_or_raise(view), view.tick).url, self.name)


@register("load_balance")
def _make(params: PolicyParams) -> LoadBalance:
    return LoadBalance(params)
