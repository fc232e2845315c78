"""smetric-ftwork: SMetric with a session's first request placed by queued prefill work.

`smetric-inflight` sends a first turn to the worker with the fewest requests in flight; this policy
sends it to the worker with the fewest unprefilled tokens (WorkerView.unprefilled: the new tokens of
the requests routed there whose first token has not come back), ties to the fewest in flight, then
round-robin (or the session's home, with a session hint). Follow-ups are `smetric-inflight`'s.

Why: a request count says little when prompts run from hundreds of tokens to 126K, and a request
that is decoding holds no prefill in front of the next one. Counting the same tokens until a request
ends instead of until its first token lost the gain on the study's trace. In the simulator
(modelled; benchmarks/results/first-turn-placement.md) it was at or above `smetric-inflight` in
every setting's mean: +2 % max TPS within SLO at 8 instances, +0.2-0.3 % at 32, +9 % / +5 % on the
Mooncake conversation trace (no / full global tier). Not the default: the study's figures are
`smetric-inflight`'s, and the signal is one router's own (not synced between replicas)."""

from __future__ import annotations

from smetric_router.core.types import RequestFeatures, WorkerView
from smetric_router.policies.base import PolicyParams, register
from smetric_router.policies.smetric import SMetric


def unprefilled(worker: WorkerView, features: RequestFeatures) -> float:
    return worker.unprefilled


@register("smetric-ftwork")
def _make(params: PolicyParams) -> SMetric:
    return SMetric(params, name="smetric-ftwork", first_key=unprefilled)
