"""smetric-inflight: SMetric with its costs in requests, the default `smetric` until the queued
prefill and the global tier's moves entered it (smetric_l3move.py).

First turn -> the fewest requests in flight. Follow-up -> the worker with the highest local hit,
unless the session looks evicted (best hit <= HIT_RATIO x est_hit) or staying costs more than
MOVE_COST_RATIO x the cheapest move, cost = (prompt - local hit) x (load + 1), load the requests
in flight there; a follow-up sent away goes where that cost is least (smetric.py says why a cost
ratio and not the paper's OVERLOAD x mean load).

Kept beside the default because the study's figures until then are its (benchmarks/results/:
files measured before the switch name it `smetric`), and because under PD, where the default's
queued-prefill term is already the prefill instances' load, it is level with the default within
the seeds' spread (benchmarks/results/pd-l3move.md: the default 0.994x / 0.992x it with a full /
1.6x tier). Against the default elsewhere (modelled; benchmarks/results/l3move.md, delay.md,
compare-knee-delay.md): 0.952x with a full global tier and 0.894x with 1.6x at 32 simulated
instances, 0.945x without a tier; 0.951x at 8 instances and 0.891x on the Mooncake conversation
trace with a full tier; on 4 emulated workers without a tier level (1.002x)."""

from __future__ import annotations

from smetric_router.policies.base import PolicyParams, register
from smetric_router.policies.smetric import SMetric


@register("smetric-inflight")
def _make(params: PolicyParams) -> SMetric:
    return SMetric(params, name="smetric-inflight")
