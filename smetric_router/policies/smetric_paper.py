"""SMetric exactly as the paper's Figure 13 writes it, kept beside the default `smetric` so the
paper's rule stays measurable as the default evolves.

s = the instance with the highest local hit (ties round-robin). A request sticks to s when it is
not a session's first (turn != 0), s is not overloaded (load[s] <= OVERLOAD x mean load) and the
session does not look evicted (hit[s] > HIT_RATIO x est_hit); otherwise it goes to the least
loaded instance, ties round-robin. Nothing else: no slack on the overload bound, no L3 view, no
session hint. The load is the view's (requests in flight under colocation, unprefilled tokens for
PD prefill instances), as the figure parameterizes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from smetric_router.core.types import ClusterView, Decision, Reason, RequestFeatures
from smetric_router.policies.base import PolicyParams, healthy_or_raise, least_load, register
from smetric_router.policies.turn import resolve_turn


@dataclass(frozen=True, slots=True)
class SMetricPaper:
    params: PolicyParams
    name: str = "smetric-paper"
    uses_text_tree: bool = False

    def needs_l3(self, features: RequestFeatures, view: ClusterView) -> bool:
        return False  # never reads WorkerView.l3_hit

    def decide(self, features: RequestFeatures, view: ClusterView) -> Decision:
        workers = healthy_or_raise(view)
        if resolve_turn(features, workers) == 0:
            return Decision(least_load(workers, view.tick).url, Reason.FIRST_TURN_BALANCE.value)
        best = max(w.hit for w in workers)
        holders = [w for w in workers if w.hit == best]
        s = holders[view.tick % len(holders)]
        mean = sum(w.load for w in workers) / len(workers)
        if s.load > self.params.overload * mean:
            reason = Reason.OVERLOAD_FALLBACK
        elif not s.hit > self.params.hit_ratio * features.est_hit:
            reason = Reason.EVICTED_FALLBACK
        else:
            return Decision(s.url, Reason.STICKY.value)
        return Decision(least_load(workers, view.tick).url, reason.value)


@register("smetric-paper")
def _make(params: PolicyParams) -> SMetricPaper:
    return SMetricPaper(params)
