"""smetric-fetch: `smetric-inflight` whose costs count what the global tier can load as fetched, not
prefilled.

`smetric-inflight` prices a worker by the tokens it would prefill there, (prompt - local hit), times
what is already in its way (load + 1). With a global tier (Mooncake as HiCache's L3) a worker
prefills only what neither its local tiers nor the tier hold, and loads the rest:

    cost = (prompt - max(hit, l3) + FETCH x max(l3 - hit, 0)) x (load + 1)

so a follow-up whose history is in L3 costs little to move, and the overload guard and the fallback
weigh the queue against a fetch rather than a recompute. FETCH is the time to load a token's KV
relative to prefilling it, from the H20 Qwen3-30B-A3B profile (engine/profiles): 96 KiB per token
over one 200 Gb/s NIC and PCIe is 6.5 us, prefill 70-94 us per token (2K-16K tokens). Without an L3
figure (0, or None while the tier's state is unknown) it is `smetric-inflight` exactly. The tier
holds the same prefix for every worker, so l3 alone never picks one: it shrinks the gap between the
holder and the others. Not the default: in the simulator (modelled; 32 instances, full global tier,
3 trace seeds; benchmarks/results/first_turn.md) it was level with `smetric-inflight` (1.001x
[0.992-1.014] max TPS within SLO), and on 8 emulated workers over a real store inside
`smetric-inflight`'s spread (benchmarks/results/README.md)."""

from __future__ import annotations

from smetric_router.core.types import RequestFeatures, WorkerView
from smetric_router.policies.base import PolicyParams, register
from smetric_router.policies.smetric import SMetric

FETCH = 0.08


def fetch_cost(worker: WorkerView, features: RequestFeatures) -> float:
    l3 = worker.l3_hit or 0
    prefill = max(features.prompt_len - max(worker.hit, l3), 0)
    fetched = max(min(l3, features.prompt_len) - worker.hit, 0)
    return (prefill + FETCH * fetched) * (worker.load + 1)


@register("smetric-fetch")
def _make(params: PolicyParams) -> SMetric:
    return SMetric(params, name="smetric-fetch", cost=fetch_cost, cost_reads_l3=True)
