"""Least tokens in use: the default decode policy under PD disaggregation.

A decode instance's load is the KV tokens it holds (the router sees tokens in use as the load of
decode instances), so the least-loaded one has the most room for the request's cache and output.
"""

from __future__ import annotations

from dataclasses import dataclass

from smetric_router.core.types import ClusterView, Decision, RequestFeatures
from smetric_router.policies.base import PolicyParams, healthy_or_raise, least_load, register


@dataclass(frozen=True, slots=True)
class LeastTokens:
    params: PolicyParams
    name: str = "least_tokens"
    uses_text_tree: bool = False

    def decide(self, features: RequestFeatures, view: ClusterView) -> Decision:
        return Decision(least_load(healthy_or_raise(view), view.tick).url, self.name)


@register("least_tokens")
def _make(params: PolicyParams) -> LeastTokens:
    return LeastTokens(params)
