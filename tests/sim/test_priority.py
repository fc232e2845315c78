"""SimConfig.follow_up_priority: the simulator sends follow-ups with the router's priority and its
instances order their queues by it, as workers running SGLang's priority scheduling do."""

from __future__ import annotations

import math
from dataclasses import replace

from smetric_router.policies import make_policy
from smetric_router.sim.cluster import Cluster
from smetric_router.sim.config import SimConfig
from smetric_router.sim.pd import PdCluster
from smetric_router.traces.schema import TraceRequest
from tests.sim.test_sim import _sessions

ONE = SimConfig(instances=1, gpu_kv_tokens=1 << 16, host_kv_tokens=0, max_running_requests=1)


def _queue() -> list[TraceRequest]:
    """A long first turn holding the only batch slot, then a new session's first turn and another
    session's follow-up (its parent replayed before the window) queued behind it, in that order."""
    trace = {r.req_id: r for r in _sessions(3, 2, gap_s=60.0)}
    return [
        replace(trace["s0t0"], arrival_s=0.0),
        replace(trace["s1t0"], arrival_s=0.001),
        replace(trace["s2t1"], arrival_s=0.002),
    ]


def _first_tokens(priority: int, pd: bool = False) -> dict[str, float]:
    cfg = replace(ONE, follow_up_priority=priority)
    trace = _queue()
    sim = PdCluster if pd else Cluster
    res = sim(cfg, make_policy("round_robin"), math.inf).run(trace)
    return {trace[r.trace_index].req_id: r.first_token for r in res.records}


def test_a_follow_up_asking_priority_passes_the_first_turn_queued_before_it() -> None:
    assert _first_tokens(0)["s1t0"] < _first_tokens(0)["s2t1"]  # arrival order
    ft = _first_tokens(1)
    assert ft["s0t0"] < ft["s2t1"] < ft["s1t0"]


def test_prefill_instances_under_pd_order_their_queues_the_same_way() -> None:
    assert _first_tokens(0, pd=True)["s1t0"] < _first_tokens(0, pd=True)["s2t1"]
    ft = _first_tokens(1, pd=True)
    assert ft["s2t1"] < ft["s1t0"]
