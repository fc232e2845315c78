"""sglang-router's cache_aware: approximate text tree, shortest queue when imbalanced.

The router maintains the per-worker text tree (cluster/text_tree.py) and fills
WorkerView.text_match / text_tree_size; this policy only reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

from smetric_router.core.types import ClusterView, Decision, RequestFeatures
from smetric_router.policies.base import (
    PolicyParams,
    healthy_or_raise,
    least_load,
    register,
    rr_argmin,
)


@dataclass(frozen=True, slots=True)
class CacheAware:
    params: PolicyParams
    name: str = "cache_aware"
    uses_text_tree: bool = True

    def needs_l3(self, features: RequestFeatures, view: ClusterView) -> bool:
        return False  # never reads WorkerView.l3_hit

    def decide(self, features: RequestFeatures, view: ClusterView) -> Decision:
        workers = healthy_or_raise(view)
        loads = [w.load for w in workers]
        hi, lo = max(loads), min(loads)
        p = self.params
        if hi - lo > p.balance_abs_threshold and hi > lo * p.balance_rel_threshold:
            return Decision(least_load(workers, view.tick).url, self.name)
        best = max(workers, key=lambda w: w.text_match)
        if features.text and best.text_match / len(features.text) > p.cache_threshold:
            return Decision(best.url, self.name)
        smallest = rr_argmin(workers, [w.text_tree_size for w in workers], view.tick)
        return Decision(smallest.url, self.name)


@register("cache_aware")
def _make(params: PolicyParams) -> CacheAware:
    return CacheAware(params)
