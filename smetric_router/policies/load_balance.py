"""Least load, KV-agnostic, with round-robin ties.

Registered twice, because the load signal depends on the role of the instances it is given:
- `load_balance`: request count under colocation; unprefilled tokens for PD prefill (as Dynamo).
- `least_tokens`: the default PD decode policy; a decode instance's load is the KV tokens it holds,
  so the least-loaded one has the most room for the request's cache and output.
"""

from __future__ import annotations

from dataclasses import dataclass

from smetric_router.core.types import ClusterView, Decision, RequestFeatures
from smetric_router.policies.base import PolicyParams, healthy_or_raise, least_load, register


@dataclass(frozen=True, slots=True)
class LoadBalance:
    params: PolicyParams
    name: str = "load_balance"
    uses_text_tree: bool = False

    def needs_l3(self, features: RequestFeatures, view: ClusterView) -> bool:
        return False  # never reads WorkerView.l3_hit

    def decide(self, features: RequestFeatures, view: ClusterView) -> Decision:
        return Decision(least_load(healthy_or_raise(view), view.tick).url, self.name)


@register("load_balance")
def _make(params: PolicyParams) -> LoadBalance:
    return LoadBalance(params)


@register("least_tokens")
def _make_least_tokens(params: PolicyParams) -> LoadBalance:
    return LoadBalance(params, name="least_tokens")
