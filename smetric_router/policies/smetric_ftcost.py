"""smetric-ftcost: SMetric with a session's first request placed by the cost of prefilling it.

`smetric` sends a first turn to the worker with the fewest requests in flight; this policy sends
it to the worker with the least (prompt - local hit) x (load + 1) (base.recompute_cost, the score
`lmetric-inflight` gives every request), ties to the fewest in flight, then round-robin (or the
session's home, with a session hint). Follow-ups are `smetric`'s.

Why: agent sessions open with one of a few long shared prefixes (system prompt, tool
definitions). A worker that holds one prefills only the rest, so it is worth a longer queue,
up to the point where the queue costs more than the prefix saves; the least loaded worker may
have to prefill or fetch all of it.

Measured (modelled): on 8 emulated workers over a real Mooncake store at the sustained knee
(benchmarks/results/compare-mooncake-8-quarter-long-ftcost.md, 2 draws) 1.036x and 1.086x
`smetric`'s goodput, level with `lmetric-inflight`, whose lead over `smetric` this is; on
4 emulated workers without a tier (compare-knee-ftcost.md, 3 draws) level with `smetric`. Not
the default: in the simulator at 8 instances without a global tier it made 0.975x [0.938-1.008]
`smetric`'s max TPS within SLO with the trace's follow-up times
(benchmarks/results/first-turn-cost-tried.md), where a shared template's sessions pile onto its
holders and their follow-ups then stay there; with follow-ups sent on each reply, as
bench_serving sends them, 0.998x (benchmarks/results/README.md)."""

from __future__ import annotations

from smetric_router.policies.base import PolicyParams, recompute_cost, register
from smetric_router.policies.smetric import SMetric


@register("smetric-ftcost")
def _make(params: PolicyParams) -> SMetric:
    return SMetric(params, name="smetric-ftcost", first_key=recompute_cost)
