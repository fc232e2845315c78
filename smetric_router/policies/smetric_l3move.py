"""smetric, the default (also named smetric-l3move, the name its first results use):
`smetric-delay`, except that a follow-up whose history the global tier holds goes where its
delay is least, as a first turn does.

`smetric-inflight` (the default before this) keeps a follow-up on the worker holding its history
unless staying costs more than MOVE_COST_RATIO x the cheapest move: moving it means prefilling that
history again elsewhere. With a global tier (Mooncake, HiCache's L3) that holds the history, a move
fetches it instead, so the factor that protects a history no other worker could get back protects
only a fetch, and the follow-up waits in its holder's queue for it. Here such a follow-up (the
global tier holds more than HIT_RATIO x its history, the eviction guard's threshold) goes to the
worker with the least

    unprefilled + (prompt - local hit) x (load + 1)

(`smetric-delay`'s cost: the prefill queued there plus the delay its own prefill puts on what runs
there; a local hit still counts, since a fetch stalls the batch it is loaded in), ties to the
higher local hit, then the fewest in flight, then the session's home or round-robin. Its holder
usually wins that comparison: its local hit makes its cost lowest unless its queue outweighs it.
Every other request, and every request without a global tier or with the tier's state unknown
(l3_hit None), is `smetric-delay`'s decision, so on colocated workers without a tier the two are
the same policy. The router waits for the master's answer only where it could change the
decision (needs_l3()).

Under PD, on a prefill instance (WorkerView.prefill_only), the load already is the unprefilled
tokens, and a prefill holds up no decoding there, so the delay a request meets is the tokens
queued ahead plus its own prefill. Where the global tier holds none of the prompt (no tier, a
history it evicted, a new prefix) the price is that sum, load + (prompt - local hit), for first
turns, both guards and the move alike; where it holds some, the product above, which in the
simulator spread sessions onto the short queues the fetches make cheap and beat the sum there by
4-6 % on two seeds of three (pd-token-cost-tried.md). With the sum where nothing is fetchable
the default went from 0.649 to 1.013 [0.945-1.071]x Bailian under PD without a tier (1.56x its
previous rule), and from 0.994x / 1.000x to 1.004x the best baseline with a 1.6x / full tier
(pd-prefill-cost.md).

Measured (modelled; benchmarks/results/l3move.md): in the simulator at 32 instances against the
better of the two LMetrics per seed 1.039 [1.030-1.056]x with a full global tier and 1.128
[1.106-1.140]x with 1.6x (`smetric-delay` 1.014x and 1.086x, `smetric-inflight` 0.989x), the
same as `smetric-delay` without one (1.075x); 1.010x and 1.008x `smetric-delay` at 8 instances
and on the Mooncake conversation trace with a full tier; over `smetric-inflight` 1.050x, 1.118x
and 1.058x at 32 instances (full, 1.6x, no tier), 1.052x at 8 and 1.122x on the Mooncake trace.
On 8 emulated workers over a real Mooncake store, reading the tier from the workers' L3 KV
events, 1.037 [0.934-1.091]x the best other router (compare-mooncake-8-quarter-long-l3events.md);
asking the master as the launcher's Mooncake spec does, 1.084 [1.073-1.101]x `smetric-inflight`
and 0.959 [0.888-1.027]x `lmetric-inflight` (compare-mooncake-8-quarter-long-default.md);
on 4 emulated workers without a tier, as `smetric-delay`, level with `smetric-inflight` (0.998x,
compare-knee-delay.md). Under PD, before the sum above (pd-l3move.md), 0.994x / 0.992x
`smetric-inflight` with a full / 1.6x tier, level within the seeds' spread.
"""

from __future__ import annotations

from dataclasses import dataclass

from smetric_router.core.types import ClusterView, Decision, RequestFeatures, WorkerView
from smetric_router.policies.base import PolicyParams, healthy_or_raise, lowest, register
from smetric_router.policies.session_home import home
from smetric_router.policies.smetric import SMetric
from smetric_router.policies.smetric_delay import delay_cost
from smetric_router.policies.turn import resolve_turn

# x-smetric-reason of a follow-up that the global tier's copy of its history let move
L3_MOVE = "l3-move"


def cost(worker: WorkerView, features: RequestFeatures) -> float:
    """The default's price of a worker for the request: `smetric-delay`'s, except on a PD
    prefill instance while the global tier holds none of the prompt. There the wait is the
    tokens queued ahead plus the request's own prefill, and that sum is the price (the instance
    decodes nothing its prefill could hold up); an unknown tier state (None) counts as none."""
    if worker.prefill_only and not (worker.l3_hit or 0) > 0:
        return worker.load + max(features.prompt_len - worker.hit, 0)
    return delay_cost(worker, features)


@dataclass(frozen=True, slots=True)
class SMetricL3Move:
    params: PolicyParams
    delay: SMetric  # smetric-delay: every decision but a follow-up the global tier holds
    name: str
    uses_text_tree: bool = False

    def needs_l3(self, features: RequestFeatures, view: ClusterView) -> bool:
        """Only a follow-up whose move, were the tier to hold its history, would go elsewhere
        than `smetric-delay` sends it: most follow-ups stay with their holder either way, and
        for them the router does not wait for the master."""
        if self.delay.needs_l3(features, view):
            return True
        if any(w.prefill_only for w in view.workers):
            # the price itself turns on whether the tier holds any of the prompt: decide for an
            # answer of none, some, and more than HIT_RATIO x the history
            held = int(self.params.hit_ratio * features.est_hit) + 1
            answers = {self.decide(features, view.answered(l3)) for l3 in (0, 1, held)}
            return len(answers) > 1
        if not self._follow_up(features, view):
            return False
        return self._move(features, view) != self.delay.decide(features, view)

    def decide(self, features: RequestFeatures, view: ClusterView) -> Decision:
        if self._follow_up(features, view) and self._fetchable(features, view):
            return self._move(features, view)
        return self.delay.decide(features, view)

    def _follow_up(self, features: RequestFeatures, view: ClusterView) -> bool:
        if features.est_hit <= 0:
            return False
        # as in SMetric: a holder whose circuit is open still tells a follow-up from a first turn
        return resolve_turn(features, [w for w in view.workers if w.healthy]) > 0

    def _move(self, features: RequestFeatures, view: ClusterView) -> Decision:
        """Where the follow-up goes when the global tier holds its history."""
        workers = healthy_or_raise(view)
        least = lowest(workers, [self.delay.cost(w, features) for w in workers])
        least = lowest(least, [-w.hit for w in least])
        least = lowest(least, [w.load for w in least])
        hint = features.session_hint
        chosen = home(hint, least) if hint is not None else least[view.tick % len(least)]
        holder = max(w.hit for w in workers)
        return Decision(chosen.url, "sticky" if chosen.hit == holder else L3_MOVE)

    def _fetchable(self, features: RequestFeatures, view: ClusterView) -> bool:
        """Whether the global tier holds more than HIT_RATIO x the history; an unknown tier
        state (None) is never read as holding it."""
        held = [w.l3_hit for w in view.workers if w.l3_hit is not None]
        return bool(held) and max(held) > self.params.hit_ratio * features.est_hit


def _build(params: PolicyParams, name: str) -> SMetricL3Move:
    delay = SMetric(params, name=name, cost=cost, first_key=cost)
    return SMetricL3Move(params, delay, name)


@register("smetric")
def _make(params: PolicyParams) -> SMetricL3Move:
    return _build(params, "smetric")


@register("smetric-l3move")
def _make_named(params: PolicyParams) -> SMetricL3Move:
    return _build(params, "smetric-l3move")
