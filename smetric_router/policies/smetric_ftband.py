"""smetric-ftband: `smetric-ftcost`'s first turn kept inside a band of load.

A first turn goes, among the workers whose load + 1 is within MOVE_COST_RATIO x the least
loaded's, to the one with the least (prompt - local hit) x (load + 1), ties to the fewest in
flight, then round-robin (or the session's home, with a session hint). Follow-ups are
`smetric-inflight`'s.

Why: a session placed on a worker that holds its template (system prompt, tool definitions)
prefills less, and for its whole life shares those pages with that worker's other sessions
instead of keeping a copy of its own; where the templates together outweigh a worker's GPU tier,
spreading every template over every worker (least load) leaves less room there for the sessions'
histories. The cost alone (`smetric-ftcost`) piles a burst of sessions opening with one long
template onto its first holder; the band lets a first turn wait behind at most the queue factor
a follow-up accepts before it moves, so first turns stay balanced within that factor.

Measured (modelled) against `smetric-inflight`, whose first turn is the least loaded: on 8 emulated
workers over a real Mooncake store at the sustained knee
(benchmarks/results/compare-mooncake-8-quarter-long-ftband.md, 3 draws) the follow-ups found 53 %
of their prompt in the GPU tier against 39 %, 92 % of requests met the SLO against 88 %, TTFT p90
7.1 s against 8.1 s, goodput 1.015x [0.929-1.105]; on 4 workers without a tier
(compare-knee-ftband.md, 3 draws) 0.979x [0.956-0.993], TTFT p90 479 against 410 ms; in the
simulator at 8 instances 1.018x without a tier and 1.014x with a full one (first_turn_cost.md),
under PD 0.993x / 0.997x (a prototype run, README). Not the default: it does not win in every
setting (behind on 4 workers without a tier and under PD, inside the draws' and seeds' spread)."""

from __future__ import annotations

from smetric_router.policies.base import PolicyParams, recompute_cost, register
from smetric_router.policies.smetric import SMetric


@register("smetric-ftband")
def _make(params: PolicyParams) -> SMetric:
    return SMetric(params, name="smetric-ftband", first_key=recompute_cost, first_band=True)
