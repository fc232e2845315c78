"""smetric-ftcost: SMetric with a session's first request placed by the cost of prefilling it.

`smetric-inflight` sends a first turn to the worker with the fewest requests in flight; this policy
sends it to the worker with the least (prompt - local hit) x (load + 1) (base.recompute_cost, the
score `lmetric-inflight` gives every request), ties to the fewest in flight, then round-robin (or
the session's home, with a session hint). Follow-ups are `smetric-inflight`'s.

Why: agent sessions open with one of a few long shared prefixes (system prompt, tool
definitions). A worker that holds one prefills only the rest, so it is worth a longer queue,
up to the point where the queue costs more than the prefix saves; the least loaded worker may
have to prefill or fetch all of it.

Measured (modelled): on 8 emulated workers over a real Mooncake store at the sustained knee
(benchmarks/results/compare-mooncake-8-quarter-long-ftcost-3draws.md, 3 draws) 1.052x
`smetric-inflight`'s goodput and 0.979x `lmetric-inflight`'s, whose lead over `smetric-inflight`
this is; on 4 emulated workers without a tier (compare-knee-ftcost.md, 3 draws) level with
`smetric-inflight`. In the simulator it is level with `smetric-inflight`: at 8 instances on a fine
rate sweep 1.010x without a global tier and 1.018x with a full one (first_turn_cost.md; the 0.975x
of first-turn-cost-tried.md was where the knees fell between four rates), under PD 0.993x and 0.997x
(pd-ftcost.md).

Not the default, for what the cost leaves out: a first turn commits its whole session, whose
follow-ups stay where it lands, and the cost prices one request. Sessions opening with one long
template gather on its holders: with the default switched to this rule (a local branch), 8
sessions started together with a shared tools template on 4 idle emulated workers went 5 and 3
onto two of them, and the overload guard then pushed one follow-up off its holder
(tests/e2e/test_sessions.py's agent-shaped workload). Likewise a first turn whose whole prompt a
worker holds costs almost nothing there (the part of its last page), so a burst of identical
first requests stays on that worker until its load outweighs a full prefill elsewhere. Both
limits are `lmetric-inflight`'s too."""

from __future__ import annotations

from smetric_router.policies.base import PolicyParams, recompute_cost, register
from smetric_router.policies.smetric import SMetric


@register("smetric-ftcost")
def _make(params: PolicyParams) -> SMetric:
    return SMetric(params, name="smetric-ftcost", first_key=recompute_cost)
