"""LMetric: score = (prompt_len - local_hit) x load, lowest wins.

The load term is (load + 1) so that an idle cluster still prefers the worker with the larger hit
instead of tying every worker at zero.
"""

from __future__ import annotations

from dataclasses import dataclass

from smetric_router.core.types import ClusterView, Decision, RequestFeatures
from smetric_router.policies.base import PolicyParams, healthy_or_raise, register, rr_argmin


@dataclass(frozen=True, slots=True)
class LMetric:
    params: PolicyParams
    name: str = "lmetric"
    uses_text_tree: bool = False

    def decide(self, features: RequestFeatures, view: ClusterView) -> Decision:
        workers = healthy_or_raise(view)
        scores = [max(features.prompt_len - w.hit, 0) * (w.load + 1) for w in workers]
        return Decision(rr_argmin(workers, scores, view.tick).url, self.name)


@register("lmetric")
def _make(params: PolicyParams) -> LMetric:
    return LMetric(params)
