"""smetric-delay: `smetric-inflight` whose cost counts the prefill already queued on a worker, for
first turns as well as for the guards.

`smetric-inflight` prices a worker for a request by the tokens it would prefill there times what is
in its way, (prompt - local hit) x (load + 1), and only for follow-ups; first turns go to the fewest
in flight. This policy adds the worker's unprefilled tokens (WorkerView.unprefilled: the new tokens
of the requests routed there whose first token has not come back):

    cost = unprefilled + (prompt - local hit) x (load + 1)

and places first turns by it too (ties to the fewest in flight, then round-robin or the session's
home). The two terms are the two delays a placement decides: the prefill queued ahead, which this
request waits for before its first token, and this request's own prefill, which holds up every
request already there (a prefill chunk shares the step with their decode). The overload guard and
the fallback compare the same cost, so a follow-up leaves a holder whose queue of long prefills
outweighs twice a cheaper worker's, where a request count saw one request.

Why the queued tokens matter: a request that is decoding and one with 100K tokens still to prefill
are one request in flight each, but only the second makes the next request wait for 100K tokens.

Measured (modelled): in the simulator (benchmarks/results/delay.md) against the better of the two
LMetrics per seed at 32 instances 1.075x without a global tier and 1.014x with a full one
(`smetric-inflight`: 1.016x and 0.989x), ahead of `smetric-inflight` in every colocated setting
there (8 instances, the Mooncake conversation trace); on 8 emulated workers over a real Mooncake
store at the sustained knee ahead of every other router on each of 3 draws (1.004x the best other,
1.091x `smetric-inflight`), and on 4 without a tier level with `smetric-inflight` (0.998x). Under PD
the router counts no unprefilled tokens beside a prefill instance's load, so it decides there as
`smetric-ftcost` (0.993x / 0.997x `smetric-inflight`). The default `smetric` (smetric_l3move.py) is
this policy plus a move for the follow-ups the global tier holds."""

from __future__ import annotations

from smetric_router.core.types import RequestFeatures, WorkerView
from smetric_router.policies.base import PolicyParams, recompute_cost, register
from smetric_router.policies.smetric import SMetric


def delay_cost(worker: WorkerView, features: RequestFeatures) -> float:
    return worker.unprefilled + recompute_cost(worker, features)


@register("smetric-delay")
def _make(params: PolicyParams) -> SMetric:
    return SMetric(params, name="smetric-delay", cost=delay_cost, first_key=delay_cost)
