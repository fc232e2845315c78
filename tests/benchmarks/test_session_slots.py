"""benchmarks/session_slots.py: a slot kept for a session's next turn goes to that turn before the
queue, a slot nobody claims goes back to the queue, and the report end to end on a tiny trace."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks import repro_colocated as rc
from benchmarks import session_slots as ss
from smetric_router.engine.timing import TimingModel
from smetric_router.policies import make_policy
from smetric_router.sim.cluster import Cluster, RunResult
from smetric_router.sim.config import SimConfig
from smetric_router.traces.schema import TraceRequest
from tests.sim.test_sim import _sessions

CAP1 = SimConfig(instances=2, gpu_kv_tokens=1 << 16, host_kv_tokens=0, follow_ups="on-reply",
                 max_concurrent_requests=1)  # fmt: skip


def _two_sessions() -> list[TraceRequest]:
    """Two sessions of two turns; the second session's first turn queues behind the first's."""
    trace = {r.req_id: r for r in _sessions(2, 2, gap_s=60.0)}
    return [
        replace(trace["s0t0"], arrival_s=0.0),
        replace(trace["s1t0"], arrival_s=0.001),
        trace["s0t1"],
        trace["s1t1"],
    ]


def _first_tokens(grace: float) -> tuple[dict[str, float], RunResult, Cluster]:
    trace = _two_sessions()
    timing = TimingModel.load(CAP1.profile)
    policy = make_policy("round_robin")
    sim = (ss.SessionSlots(CAP1, policy, math.inf, timing, grace) if grace
           else Cluster(CAP1, policy, math.inf, timing=timing))  # fmt: skip
    res = sim.run(trace)
    return {trace[r.trace_index].req_id: r.first_token for r in res.records}, res, sim


def test_the_plain_cap_gives_a_freed_slot_to_the_queue() -> None:
    ft, res, _ = _first_tokens(0.0)
    assert ft["s0t0"] < ft["s1t0"] < ft["s0t1"]
    assert len(res.records) == 4


def test_a_kept_slot_goes_to_the_sessions_next_turn_first() -> None:
    ft, res, sim = _first_tokens(1.0)
    assert ft["s0t0"] < ft["s0t1"] < ft["s1t0"] < ft["s1t1"]
    assert isinstance(sim, ss.SessionSlots)
    assert sim.claims == 2  # s0t1 and s1t1 each took the slot its session left
    # s1t0 waited for s0t1's slot, which nobody claimed, to come back after the grace
    s0t1_finish = next(r.finish for r in res.records if r.first_token == ft["s0t1"])
    assert ft["s1t0"] >= s0t1_finish + 1.0
    assert not sim.kept


def test_kept_slots_need_the_cap() -> None:
    with pytest.raises(ValueError, match="cap"):
        ss.SessionSlots(replace(CAP1, max_concurrent_requests=0), make_policy("round_robin"),
                        math.inf, TimingModel.load(CAP1.profile), 1.0)  # fmt: skip


def test_the_report_end_to_end_on_a_tiny_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rc, "WORK", tmp_path)
    monkeypatch.setattr(rc, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(rc, "RESULTS", tmp_path / "results")
    (tmp_path / "results").mkdir()
    monkeypatch.setattr(rc, "STUDY", rc.Study(sessions=20, limit=60, seeds=(1,), min_requests=40))
    monkeypatch.setattr(rc, "SEEDS", (1,))
    monkeypatch.setattr(rc, "_traces", {})
    monkeypatch.setattr(ss, "RATES", (1.0,))
    monkeypatch.setattr(ss, "CAPS", (4,))
    with pytest.raises(SystemExit, match="not cached"):
        ss.main(["--report-only"])
    ss.main([])
    text = (tmp_path / "results" / "session-slots.md").read_text()
    assert "| 1x | smetric, cap 4, slots kept 1 s |" in text
    assert "| 1x | lmetric, no cap |" in text
    ss.main(["--report-only"])  # every run now cached
