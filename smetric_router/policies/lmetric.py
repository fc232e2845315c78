"""LMetric, the paper's baseline: score = (prompt_len - local_hit) x running batch, lowest wins.

The paper (§4.1, Figure 10) defines f = (L - c_i) x l_i: L the prompt length, c_i the instance's
local KV hit, l_i its current batch size. Here:
- c_i is WorkerView.hit, the local tier: the GPU in the simulator's paper mode, GPU + host tier
  in its hicache mode (sim/cluster.py); the global tier never counts. L - c_i is floored at 0.
- l_i is WorkerView.running, the requests the worker reports running (its batch; queued requests
  do not count). Only where that is unknown (None: no fresh /v1/loads report) does it fall back
  to WorkerView.load, the router's in-flight count (running + queued).
  In the router the report is up to one load poll old (--load-poll-interval-secs), so requests
  it sends to an instance between two polls do not raise that instance's score; the simulator
  reads the engine's batch at each decision.
- The product is plain, as in the paper: an idle instance (batch 0) scores 0 whatever its hit and
  wins; idle instances tie and are taken round-robin. The paper names this (both factors 0) as
  its one failure case and gives no rule for it. Our variant with an in-flight count + 1, which
  keeps a follow-up on its cache while the cluster is idle, is `lmetric-inflight`.
- PD prefill instances carry no running count (None): there l_i is the load, the unprefilled
  tokens (sim/pd.py, router/pd.py), the SMetric paper's §5.3 signal for PD.
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

    def needs_l3(self, features: RequestFeatures, view: ClusterView) -> bool:
        return False  # never reads WorkerView.l3_hit

    def decide(self, features: RequestFeatures, view: ClusterView) -> Decision:
        workers = healthy_or_raise(view)
        scores = [
            max(features.prompt_len - w.hit, 0) * (w.load if w.running is None else w.running)
            for w in workers
        ]
        return Decision(rr_argmin(workers, scores, view.tick).url, self.name)


@register("lmetric")
def _make(params: PolicyParams) -> LMetric:
    return LMetric(params)
