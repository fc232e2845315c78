"""Bailian's production scheduler: score = (1-λ)·norm(load) + λ·(1 - hit_ratio), lowest wins.

The paper (§4.1) defines f = (1-λ)·l̂_i + λ·(1-ĉ_i): ĉ_i the KV hit ratio, l̂_i the normalised
batch size, λ large for agentic workloads. Here ĉ_i = local hit / prompt length (WorkerView.hit:
the GPU tier in the simulator's paper mode, GPU + host in its hicache mode) and l̂_i = load /
the largest load among the candidates. Deviations: the load is the router's in-flight count
(running batch + waiting queue; unprefilled tokens under PD), as for lmetric-inflight; the
paper does not say how Bailian normalises the batch size, and max-normalisation is our choice
(it keeps l̂ in [0, 1] like ĉ). λ = 0.6 (PolicyParams.bailian_lambda, swept in
benchmarks/results/bailian_lambda.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from smetric_router.core.types import ClusterView, Decision, RequestFeatures
from smetric_router.policies.base import PolicyParams, healthy_or_raise, register, rr_argmin


@dataclass(frozen=True, slots=True)
class Bailian:
    params: PolicyParams
    name: str = "bailian"
    uses_text_tree: bool = False

    def needs_l3(self, features: RequestFeatures, view: ClusterView) -> bool:
        return False  # never reads WorkerView.l3_hit

    def decide(self, features: RequestFeatures, view: ClusterView) -> Decision:
        workers = healthy_or_raise(view)
        lam = self.params.bailian_lambda
        max_load = max(w.load for w in workers) or 1.0
        prompt = max(features.prompt_len, 1)
        scores = [
            (1 - lam) * w.load / max_load + lam * (1 - min(w.hit, prompt) / prompt) for w in workers
        ]
        return Decision(rr_argmin(workers, scores, view.tick).url, self.name)


@register("bailian")
def _make(params: PolicyParams) -> Bailian:
    return Bailian(params)
