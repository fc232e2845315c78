"""SMetric's balanced session-centric scheduling: the paper's Figure 13 (kept as written in
smetric_paper.py) with a cost-aware placement of the follow-ups it does not stick.

First request of a session -> least load. Follow-up -> the worker with the highest local hit,
unless that worker is overloaded (load > OVERLOAD x mean, and more than a slack of two requests
above the mean — see PolicyParams.overload_slack) or the session looks evicted
(best hit <= HIT_RATIO x est_hit). A follow-up a guard sends away goes, among the workers not
overloaded, where it recomputes least for the load already there: (prompt - local hit) x
(load + 1) (base.least_recompute), where the figure takes the least loaded. The figure's rule
moves it by load alone, onto an instance that then prefills or fetches its whole history, though
another one nearly as idle holds part of it (its template, an older prefix, the copy left after
a partial eviction). First requests stay balanced by load: scoring them too (tried) piles the
sessions of a shared template onto its holders, whose follow-ups the overload guard then moves.
In the simulator (modelled; benchmarks/results/fig11.md: 3 trace seeds, 32 instances, paper
tier mode, each seed's best rate) it takes max TPS within SLO from smetric-paper's 156.5K to
162.4K tokens/s with no global tier and from 304.4K to 308.8K with a full one. Ties round-robin."""

from __future__ import annotations

from dataclasses import dataclass

from smetric_router.core.types import ClusterView, Decision, Reason, RequestFeatures, WorkerView
from smetric_router.policies.base import (
    PolicyParams,
    healthy_or_raise,
    least_load,
    least_recompute,
    register,
)
from smetric_router.policies.session_home import home
from smetric_router.policies.turn import resolve_turn


@dataclass(frozen=True, slots=True)
class SMetric:
    params: PolicyParams
    name: str = "smetric"
    uses_text_tree: bool = False

    def decide(self, features: RequestFeatures, view: ClusterView) -> Decision:
        workers = healthy_or_raise(view)
        hint = features.session_hint
        # A holder whose circuit is open still tells a follow-up from a first turn.
        if resolve_turn(features, [w for w in view.workers if w.healthy]) == 0:
            if hint is not None:
                low = min(w.load for w in workers)
                tie = low + 1e-9 * max(1.0, abs(low))  # as least_load's ties
                chosen = home(hint, [w for w in workers if w.load <= tie])
            else:
                chosen = least_load(workers, view.tick)
            return Decision(chosen.url, Reason.FIRST_TURN_BALANCE.value)

        best_hit = max(w.hit for w in workers)
        candidates = [w for w in workers if w.hit == best_hit]
        if hint is not None:
            target = home(hint, candidates)
        else:
            target = candidates[view.tick % len(candidates)]

        mean_load = sum(w.load for w in workers) / len(workers)
        p = self.params
        # (an idle cluster has no ratio bound: inf x 0 would be NaN, and no load is above NaN)
        ratio_bound = p.overload * mean_load if mean_load > 0 else 0.0
        limit = max(ratio_bound, mean_load + p.overload_slack)
        if target.load > limit:
            return self._fallback(workers, features, hint, mean_load, limit, view.tick,
                                  Reason.OVERLOAD_FALLBACK)  # fmt: skip
        # est_hit == 0 means the request carries no countable history: nothing to have been evicted.
        if features.est_hit > 0 and not best_hit > p.hit_ratio * features.est_hit:
            # Fetchable: the target keeps its local part and loads the rest from L3. Without any
            # local part every worker would fetch it all, so balancing costs nothing more.
            l3 = target.l3_hit
            fetchable = l3 is not None and l3 > p.hit_ratio * features.est_hit
            if p.l3_aware and best_hit > 0 and fetchable:
                return Decision(target.url, Reason.STICKY_L3.value)
            held = p.hit_ratio * features.est_hit
            shut = any(w.healthy and w.breaker_open and w.hit > held for w in view.workers)
            reason = Reason.BREAKER_OPEN if shut else Reason.EVICTED_FALLBACK
            return self._fallback(workers, features, hint, mean_load, limit, view.tick, reason)
        return Decision(target.url, Reason.STICKY.value)

    @staticmethod
    def _fallback(
        workers: tuple[WorkerView, ...],
        features: RequestFeatures,
        hint: str | None,
        mean: float,
        limit: float,
        tick: int,
        reason: Reason,
    ) -> Decision:
        """Least recompute for the load among the workers not overloaded (the least loaded never
        is), so an overloaded holder's hit cannot win the request back. With a session hint, the
        session's home among the workers at or below the mean load (the least loaded always is),
        where its next follow-ups will find this request's cache: a bound of the mean, not the
        sticky guard's OVERLOAD x mean, as moving costs the history's prefill anyway, so the move
        should not also buy a queue (the looser bound lost up to 1% TPS within SLO in the
        simulator without cache pressure). A holder's open circuit keeps its reason with a hint
        too: that the worker is failing matters more to whoever reads the headers."""
        if hint is None:
            fit = [w for w in workers if w.load <= limit]
            return Decision(least_recompute(fit, features, tick).url, reason.value)
        chosen = home(hint, [w for w in workers if w.load <= mean])
        if reason is not Reason.BREAKER_OPEN:
            reason = Reason.SESSION_HINT_FALLBACK
        return Decision(chosen.url, reason.value)


@register("smetric")
def _make(params: PolicyParams) -> SMetric:
    return SMetric(params)
