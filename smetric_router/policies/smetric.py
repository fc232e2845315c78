"""SMetric's balanced session-centric scheduling (the paper's Figure 13).

First request of a session -> least load. Follow-up -> the worker with the highest local hit,
unless that worker is overloaded (load > OVERLOAD x mean, and more than a slack of two requests
above the mean — see PolicyParams.overload_slack) or the session looks evicted
(best hit <= HIT_RATIO x est_hit); both guards fall back to least load. Ties round-robin.
L3-aware (PolicyParams.l3_aware, opt-in, with the router's L3 view): a history evicted locally but
held in
the global tier (L3) is fetchable, not lost; the follow-up stays with its best local holder
(`sticky-l3`), which loads the rest from L3.
"""

from __future__ import annotations

from dataclasses import dataclass

from smetric_router.core.types import ClusterView, Decision, Reason, RequestFeatures
from smetric_router.policies.base import PolicyParams, healthy_or_raise, least_load, register
from smetric_router.policies.turn import resolve_turn


@dataclass(frozen=True, slots=True)
class SMetric:
    params: PolicyParams
    name: str = "smetric"
    uses_text_tree: bool = False

    def decide(self, features: RequestFeatures, view: ClusterView) -> Decision:
        workers = healthy_or_raise(view)
        if resolve_turn(features, workers) == 0:
            return Decision(least_load(workers, view.tick).url, Reason.FIRST_TURN_BALANCE.value)

        best_hit = max(w.hit for w in workers)
        candidates = [w for w in workers if w.hit == best_hit]
        target = candidates[view.tick % len(candidates)]

        mean_load = sum(w.load for w in workers) / len(workers)
        p = self.params
        if target.load > max(p.overload * mean_load, mean_load + p.overload_slack):
            return Decision(least_load(workers, view.tick).url, Reason.OVERLOAD_FALLBACK.value)
        # est_hit == 0 means the request carries no countable history: nothing to have been evicted.
        if features.est_hit > 0 and not best_hit > p.hit_ratio * features.est_hit:
            # Fetchable: the target keeps its local part and loads the rest from L3. Without any
            # local part every worker would fetch it all, so balancing costs nothing more.
            l3 = target.l3_hit
            fetchable = l3 is not None and l3 > p.hit_ratio * features.est_hit
            if p.l3_aware and best_hit > 0 and fetchable:
                return Decision(target.url, Reason.STICKY_L3.value)
            return Decision(least_load(workers, view.tick).url, Reason.EVICTED_FALLBACK.value)
        return Decision(target.url, Reason.STICKY.value)


@register("smetric")
def _make(params: PolicyParams) -> SMetric:
    return SMetric(params)
