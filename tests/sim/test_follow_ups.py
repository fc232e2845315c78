"""When a follow-up arrives (SimConfig.follow_ups): at its trace time, not before its parent's
reply ends, or as soon as that reply ends."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from smetric_router.policies import make_policy
from smetric_router.sim.cluster import Cluster, RequestRecord
from smetric_router.sim.config import SimConfig
from smetric_router.sim.pd import PdCluster
from smetric_router.traces.schema import TraceRequest
from tests.sim.test_sim import SMALL, _sessions


def _by_id(mode: str, trace: list[TraceRequest]) -> dict[str, RequestRecord]:
    res = Cluster(replace(SMALL, follow_ups=mode), make_policy("round_robin"), math.inf).run(trace)
    assert len(res.records) == len(trace)
    return {trace[r.trace_index].req_id: r for r in res.records}


def _parent_reply_ends(recs: dict[str, RequestRecord], trace: list[TraceRequest]) -> list[float]:
    return [recs[r.parent].finish for r in trace if r.parent is not None]


def test_trace_mode_sends_a_follow_up_at_its_time_even_before_its_parent_ends() -> None:
    trace = _sessions(2, 3, gap_s=0.001)
    recs = _by_id("trace", trace)
    follow = [r for r in trace if r.parent is not None]
    assert [recs[r.req_id].arrival for r in follow] == pytest.approx([r.arrival_s for r in follow])
    ends = _parent_reply_ends(recs, trace)
    assert all(recs[r.req_id].arrival < end for r, end in zip(follow, ends, strict=True))


def test_after_reply_waits_for_the_reply_and_keeps_a_longer_trace_gap() -> None:
    early = _sessions(2, 3, gap_s=0.001)  # the trace's next turn comes before the reply ends
    recs = _by_id("after-reply", early)
    follow = [r for r in early if r.parent is not None]
    got = [recs[r.req_id].arrival for r in follow]
    assert got == pytest.approx(_parent_reply_ends(recs, early))
    late = _sessions(2, 3, gap_s=30.0)  # ... and long after it
    recs = _by_id("after-reply", late)
    follow = [r for r in late if r.parent is not None]
    got = [recs[r.req_id].arrival for r in follow]
    assert got == pytest.approx([r.arrival_s for r in follow])
    assert all(a > end for a, end in zip(got, _parent_reply_ends(recs, late), strict=True))


def test_on_reply_sends_each_follow_up_when_its_parent_ends_whatever_the_gap() -> None:
    trace = _sessions(2, 3, gap_s=30.0)
    recs = _by_id("on-reply", trace)
    follow = [r for r in trace if r.parent is not None]
    got = [recs[r.req_id].arrival for r in follow]
    assert got == pytest.approx(_parent_reply_ends(recs, trace))
    assert max(got) < 30.0  # no trace gap kept
    firsts = [r for r in trace if r.parent is None]
    assert [recs[r.req_id].arrival for r in firsts] == pytest.approx([r.arrival_s for r in firsts])
    assert all(r.finish > 0 for r in recs.values())


def test_a_follow_up_whose_parent_is_missing_arrives_at_its_trace_time() -> None:
    trace = [r for r in _sessions(1, 3, gap_s=30.0) if r.turn > 0]  # turn 0 left out
    recs = _by_id("on-reply", trace)
    assert recs[trace[0].req_id].arrival == pytest.approx(0.0)  # the trace's first, at t0
    assert recs[trace[1].req_id].arrival == pytest.approx(recs[trace[0].req_id].finish)


def test_waiting_follow_ups_are_refused_under_pd_and_bad_modes_everywhere() -> None:
    with pytest.raises(ValueError, match="follow-ups on-reply"):
        PdCluster(replace(SMALL, follow_ups="on-reply"), make_policy("smetric"), math.inf)
    with pytest.raises(ValueError, match="follow_ups"):
        SimConfig(follow_ups="closed")
