"""lmetric-inflight: our stronger LMetric variant, score = (prompt_len - local_hit) x (load + 1).

It differs from the paper's LMetric (lmetric.py) in the batch-size factor, on purpose:
- l_i is WorkerView.load, not the reported running batch: under colocation the requests in
  flight at the instance as the router counts them (routed, not finished), i.e. its running
  batch plus its waiting queue. The router's count is exact for its own dispatches and never a
  poll behind, and a queue is load too. Under PD it is the unprefilled tokens (sim/pd.py,
  router/pd.py), the SMetric paper's §5.3 signal, as for lmetric.
- The factor is (load + 1): with l_i = 0 every idle instance scores 0 whatever its hit, so an
  idle (or partly idle) cluster spreads a session's follow-up by tie-break instead of sending it
  to its cache. With dozens of requests in flight per instance the + 1 barely moves the scores.
It exists because it keeps follow-ups on their caches at light load, where the paper's product
does not, which makes it the stronger baseline to hold SMetric against; and the LMetric results
recorded in benchmarks/results/ before `lmetric` became the paper's product were measured with
it. `lmetric` stays the paper's definition.
c_i is WorkerView.hit, the local tier, as for lmetric.
"""

from __future__ import annotations

from dataclasses import dataclass

from smetric_router.core.types import ClusterView, Decision, RequestFeatures
from smetric_router.policies.base import (
    PolicyParams,
    healthy_or_raise,
    least_recompute,
    register,
)


@dataclass(frozen=True, slots=True)
class LMetricInflight:
    params: PolicyParams
    name: str = "lmetric-inflight"
    uses_text_tree: bool = False

    def needs_l3(self, features: RequestFeatures, view: ClusterView) -> bool:
        return False  # never reads WorkerView.l3_hit

    def decide(self, features: RequestFeatures, view: ClusterView) -> Decision:
        chosen = least_recompute(healthy_or_raise(view), features, view.tick)
        return Decision(chosen.url, self.name)


@register("lmetric-inflight")
def _make(params: PolicyParams) -> LMetricInflight:
    return LMetricInflight(params)
