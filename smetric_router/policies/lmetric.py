"""LMetric: score = (prompt_len - local_hit) x load, lowest wins.

The paper (§4.1, Figure 10) defines f = (L - c_i) x l_i: L the prompt length, c_i the instance's
local KV hit, l_i its batch size. Deviations, both kept on purpose:
- l_i is WorkerView.load: under PD colocation the requests in flight at the instance as the
  router counts them (routed, not finished), i.e. its running batch plus its waiting queue. The
  router never sees the engine's batch; while the KV pool admits every routed request (the
  usual case at 256 max running requests) the two are equal, and a queue is load too.
  Under PD it is the unprefilled tokens (sim/pd.py, router/pd.py), the paper's §5.3 signal.
- The load term is (load + 1): with l_i = 0 every idle instance scores 0 whatever its hit, so an
  idle (or partly idle) cluster would spread a session's follow-up by tie-break instead of
  sending it to its cache. With dozens of requests in flight per instance the + 1 barely moves
  the scores.
c_i is WorkerView.hit, the local tier: the GPU in the simulator's paper mode, GPU + host tier
in its hicache mode (sim/cluster.py); the global tier never counts.
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
