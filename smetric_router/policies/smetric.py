"""SMetric's balanced session-centric scheduling (the paper's Figure 13).

First request of a session -> least load. Follow-up -> the worker with the highest local hit,
unless that worker is overloaded (load > OVERLOAD x mean, and more than a slack of two requests
above the mean — see PolicyParams.overload_slack) or the session looks evicted
(best hit <= HIT_RATIO x est_hit); both guards fall back to least load. Ties round-robin.
L3-aware (PolicyParams.l3_aware, opt-in, with the router's L3 view): a history evicted locally but
held in the global tier (L3) is fetchable, not lost; the follow-up stays with its best local holder
(`sticky-l3`), which loads the rest from L3.
Session hint (RequestFeatures.session_hint, an agent's session header), read only where the view
leaves the choice open: ties among the least loaded (first turn) or among the best holders go to
the session's home (policies/session_home.py), and a follow-up the guards send away from its
holder goes to the first worker in its home ranking whose load is at most the mean
(`session-hint-fallback`) instead of the least loaded one, so a session's requests meet on one
worker whichever replica routes them. Simulated in benchmarks/results/session_hints.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from smetric_router.core.types import ClusterView, Decision, Reason, RequestFeatures, WorkerView
from smetric_router.policies.base import PolicyParams, healthy_or_raise, least_load, register
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
        if resolve_turn(features, workers) == 0:
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
        limit = max(p.overload * mean_load, mean_load + p.overload_slack)
        if target.load > limit:
            return self._fallback(workers, hint, mean_load, view.tick, Reason.OVERLOAD_FALLBACK)
        # est_hit == 0 means the request carries no countable history: nothing to have been evicted.
        if features.est_hit > 0 and not best_hit > p.hit_ratio * features.est_hit:
            # Fetchable: the target keeps its local part and loads the rest from L3. Without any
            # local part every worker would fetch it all, so balancing costs nothing more.
            l3 = target.l3_hit
            fetchable = l3 is not None and l3 > p.hit_ratio * features.est_hit
            if p.l3_aware and best_hit > 0 and fetchable:
                return Decision(target.url, Reason.STICKY_L3.value)
            return self._fallback(workers, hint, mean_load, view.tick, Reason.EVICTED_FALLBACK)
        return Decision(target.url, Reason.STICKY.value)

    @staticmethod
    def _fallback(
        workers: tuple[WorkerView, ...], hint: str | None, mean: float, tick: int, reason: Reason
    ) -> Decision:
        """Least load; with a session hint, the session's home among the workers at or below the
        mean load (the least loaded always is), where its next follow-ups will find this
        request's cache. A bound of the mean, not the sticky guard's OVERLOAD x mean: moving
        costs the history's prefill anyway, so the move should not also buy a queue (the
        looser bound lost up to 1% TPS within SLO in the simulator without cache pressure)."""
        if hint is None:
            return Decision(least_load(workers, tick).url, reason.value)
        chosen = home(hint, [w for w in workers if w.load <= mean])
        return Decision(chosen.url, Reason.SESSION_HINT_FALLBACK.value)


@register("smetric")
def _make(params: PolicyParams) -> SMetric:
    return SMetric(params)
