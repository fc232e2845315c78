"""SMetric's balanced session-centric scheduling, the rule every `smetric-*` policy is built on:
the paper's Figure 13 (kept as written in smetric_paper.py) with its overload guard in units of
cost instead of load. `smetric-inflight` (smetric_inflight.py) is this rule with its own costs
and was the default; the default `smetric` (smetric_l3move.py) builds on it with the queued
prefill in its cost and a move for a follow-up the global tier holds.

First request of a session -> least load (or the least `first_key`, then load). Follow-up -> the
worker with the highest local hit, unless the session looks evicted (best hit <= HIT_RATIO x
est_hit) or staying costs more than MOVE_COST_RATIO x the cheapest move, where `cost` prices a
worker for the request (by default the tokens it would prefill there times what is already in
its way, (prompt - local hit) x (load + 1), base.least_recompute's score). A follow-up either
guard sends away goes where that cost is lowest, where the figure takes the least loaded.

Why cost, not the figure's OVERLOAD x mean load: a ratio of loads means different things at 4
and at 32 workers, and it ignores what a move costs. On a cluster of 4 the bound is never reached
(the sticky holders' queues grew while it held); on 32 it moves a long history off a holder that
is only twice as loaded, onto a worker that then prefills all of it. The cost ratio compares the
two things a move trades, the queue avoided against the history recomputed, and needs no mean.
The factor 2 keeps a session on its cache while the two are close. In the simulator (modelled;
32 instances, paper tier mode, 3 trace seeds, each seed's best rate; benchmarks/results/fig11.md)
it took max TPS within SLO from 162.4K to 178.8K tokens/s with no global tier (above
lmetric-inflight on every seed) and left the full-tier figure level (308.8K -> 305.8K, within
the seeds' spread); factors 1 to 4 were within 2 % of each other.

First requests stay balanced by load unless a `first_key` says otherwise: scoring them by the
recompute cost alone (tried) piles the sessions of a shared template onto its holders. Ties
round-robin."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from smetric_router.core.types import ClusterView, Decision, Reason, RequestFeatures, WorkerView
from smetric_router.policies.base import (
    PolicyParams,
    healthy_or_raise,
    lowest,
    recompute_cost,
)
from smetric_router.policies.session_home import home
from smetric_router.policies.turn import resolve_turn


@dataclass(frozen=True, slots=True)
class SMetric:
    params: PolicyParams
    name: str
    uses_text_tree: bool = False
    # a worker's cost for the request, which the overload guard compares and the fallback
    # minimises (smetric_fetch.py counts what the global tier can load as fetched)
    cost: Callable[[WorkerView, RequestFeatures], float] = recompute_cost
    cost_reads_l3: bool = False
    # what a first turn minimises before the load (smetric_ftwork.py, smetric_ftrecent.py,
    # smetric_ftcost.py, smetric_ftband.py); None: the load alone
    first_key: Callable[[WorkerView, RequestFeatures], float] | None = None
    # first turns only on the workers whose load + 1 is within move_cost_ratio x the least
    # loaded's (smetric_ftband.py): the least loaded is always among them
    first_band: bool = False

    def needs_l3(self, features: RequestFeatures, view: ClusterView) -> bool:
        return self.params.l3_aware or self.cost_reads_l3

    def decide(self, features: RequestFeatures, view: ClusterView) -> Decision:
        workers = healthy_or_raise(view)
        hint = features.session_hint
        # A holder whose circuit is open still tells a follow-up from a first turn.
        if resolve_turn(features, [w for w in view.workers if w.healthy]) == 0:
            least: Sequence[WorkerView] = workers
            if self.first_band:
                bound = self.params.move_cost_ratio * (min(w.load for w in workers) + 1)
                least = [w for w in workers if w.load + 1 <= bound]
            if self.first_key is not None:
                least = lowest(least, [self.first_key(w, features) for w in least])
            least = lowest(least, [w.load for w in least])
            chosen = home(hint, least) if hint is not None else least[view.tick % len(least)]
            return Decision(chosen.url, Reason.FIRST_TURN_BALANCE.value)

        best_hit = max(w.hit for w in workers)
        candidates = [w for w in workers if w.hit == best_hit]
        if hint is not None:
            target = home(hint, candidates)
        else:
            target = candidates[view.tick % len(candidates)]

        p = self.params
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
            return self._fallback(workers, features, hint, view.tick, reason)
        others = [w for w in workers if w is not target]
        if others:
            cheapest = min(self.cost(w, features) for w in others)
            if self.cost(target, features) > p.move_cost_ratio * cheapest:
                return self._fallback(others, features, hint, view.tick,
                                      Reason.OVERLOAD_FALLBACK)  # fmt: skip
        return Decision(target.url, Reason.STICKY.value)

    def _fallback(
        self,
        workers: Sequence[WorkerView],
        features: RequestFeatures,
        hint: str | None,
        tick: int,
        reason: Reason,
    ) -> Decision:
        """Least recompute for the load. A session hint only breaks a tie among the cheapest
        (often: idle workers holding none of the history), for the session's home, where its
        next follow-ups will find this request's cache and which every replica computes alike.
        Sending it home over a cheaper worker (tried: home among the workers at or below the
        mean load) cost 14-49 % TPS within SLO without a global tier and 1.6-8.5 % with a full
        one in the simulator once the guard was a cost ratio.
        A holder's open circuit keeps its reason with a hint too: that the worker is failing
        matters more to whoever reads the headers."""
        cheapest = lowest(workers, [self.cost(w, features) for w in workers])
        if hint is None or len(cheapest) == 1:
            return Decision(cheapest[tick % len(cheapest)].url, reason.value)
        if reason is not Reason.BREAKER_OPEN:
            reason = Reason.SESSION_HINT_FALLBACK
        return Decision(home(hint, cheapest).url, reason.value)
