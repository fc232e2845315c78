"""smetric-ftwork: SMetric with a session's first request placed by queued prefill work.

`smetric` sends a first turn to the worker with the fewest requests in flight; this policy sends
it to the worker with the fewest unprefilled tokens (WorkerView.unprefilled: the new tokens of
the requests routed there whose first token has not come back), ties to the fewest in flight,
then round-robin (or the session's home, with a session hint). Follow-ups are `smetric`'s.

Why: a request count says little when prompts run from hundreds of tokens to 126K, and a request
that is decoding holds no prefill in front of the next one. Counting the same tokens until a
request ends instead of until its first token lost the gain on the study's trace. In the
simulator (modelled; benchmarks/results/first-turn-placement.md) it was at or above `smetric` in
every setting's mean: +2 % max TPS within SLO at 8 instances, +0.2-0.3 % at 32, +9 % / +5 % on
the Mooncake conversation trace (no / full global tier). Not the default: the study's figures are
`smetric`'s, and the signal is one router's own (not synced between replicas)."""

from __future__ import annotations

from dataclasses import dataclass, field

from smetric_router.core.types import ClusterView, Decision, Reason, RequestFeatures
from smetric_router.policies.base import PolicyParams, healthy_or_raise, lowest, register
from smetric_router.policies.session_home import home
from smetric_router.policies.smetric import SMetric
from smetric_router.policies.turn import resolve_turn


@dataclass(frozen=True, slots=True)
class SMetricFirstByWork:
    params: PolicyParams
    name: str = "smetric-ftwork"
    uses_text_tree: bool = False
    follow_ups: SMetric = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "follow_ups", SMetric(self.params))

    @property
    def uses_l3(self) -> bool:
        return self.follow_ups.uses_l3

    def decide(self, features: RequestFeatures, view: ClusterView) -> Decision:
        workers = healthy_or_raise(view)
        if resolve_turn(features, [w for w in view.workers if w.healthy]) != 0:
            return self.follow_ups.decide(features, view)
        least = lowest(workers, [w.unprefilled for w in workers])
        least = lowest(least, [w.load for w in least])
        hint = features.session_hint
        chosen = home(hint, least) if hint is not None else least[view.tick % len(least)]
        return Decision(chosen.url, Reason.FIRST_TURN_BALANCE.value)


@register("smetric-ftwork")
def _make(params: PolicyParams) -> SMetricFirstByWork:
    return SMetricFirstByWork(params)
