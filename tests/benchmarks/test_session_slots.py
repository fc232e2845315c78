"""benchmarks/session_slots.py: the report end to end on a tiny trace (the kept slots themselves:
tests/sim/test_admission.py, tests/admission/test_slots.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks import repro_colocated as rc
from benchmarks import session_slots as ss
from smetric_router.sim.cluster import RequestRecord
from smetric_router.traces.schema import TraceRequest
from tests.helpers.study import tiny_study


def test_the_report_end_to_end_on_a_tiny_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tiny_study(
        monkeypatch, tmp_path, rc.Study(sessions=20, limit=60, seeds=(1,), min_requests=40)
    )
    monkeypatch.setattr(ss, "RATES", (1.0,))
    monkeypatch.setattr(ss, "NO_TIER_RATES", (0.5,))
    monkeypatch.setattr(ss, "CAPS", (4,))
    monkeypatch.setattr(ss, "SIZES", (2, 4))
    monkeypatch.setattr(ss, "SIZE_POINTS", ((math.inf, 1.0), (0.0, 0.5)))
    with pytest.raises(SystemExit, match="not cached"):
        ss.main(["--report-only"])
    ss.main([])
    text = (results / "session-slots.md").read_text()
    full, none = text.split("## Without a global tier")
    assert "| 1x | smetric, cap 4, slots kept 1 s |" in full
    assert "| 1x | lmetric, no cap |" in full
    assert "lmetric-inflight" not in full
    assert "| 0.5x | smetric, cap 4, slots kept 1 s |" in none
    assert "| 0.5x | lmetric-inflight, no cap |" in none
    assert "| 0.5x | smetric, cap 4, first-turn ceiling inf s |" in none
    assert "ceiling inf" not in full
    none, sizes = none.split("## How large a cap, with kept slots")
    assert "| full tier, 1x |" in sizes and "| no tier, 0.5x |" in sizes
    assert "| setting | cap 2 | cap 4 | lmetric, no cap |" in sizes
    ss.main(["--report-only"])  # every run now cached


def test_sessions_open_is_their_time_average_over_the_run() -> None:
    # two overlapping for 1 s of 3: open 1, then 2, then 1
    assert ss.time_mean([(0.0, 2.0), (1.0, 3.0)]) == pytest.approx(4 / 3)
    assert ss.time_mean([(0.0, 1.0), (2.0, 3.0)]) == pytest.approx(2 / 3)
    assert ss.time_mean([]) == 0.0


def test_session_columns_read_each_session_and_the_history_its_follow_ups_found() -> None:
    reqs = [
        TraceRequest("a0", 0.0, "a", None, 0, 100, 10, (1,), 16),
        TraceRequest("a1", 2.0, "a", None, 1, 200, 10, (1, 2), 16, history_len=120),
        TraceRequest("b0", 1.0, "b", None, 0, 100, 10, (3,), 16),
    ]
    records = [
        RequestRecord(0.0, 100, 10, 0, 0, 0, first_token=0.5, finish=1.0, trace_index=0),
        RequestRecord(2.0, 200, 10, 1, 0, 0, 90, 0, 5.0, 6.0, trace_index=1, router_wait=3.0),
        RequestRecord(1.0, 100, 10, 0, 1, 1, 0, 0, 2.5, 3.0, trace_index=2, router_wait=1.0),
    ]
    cols = ss.session_columns(records, reqs)
    # a runs 0-6, b from its placement at 2 (not its arrival at 1) to 3: 7 over 6 s
    assert cols["sessions_running"] == pytest.approx(7 / 6)
    assert cols["history_found"] == pytest.approx(90 / 120)
    assert cols["wait_follow_up"] == pytest.approx(3.0)
    assert cols["wait_first"] == pytest.approx(0.5)


def test_a_refused_request_holds_no_session_open_but_counts_its_wait() -> None:
    reqs = [
        TraceRequest("a0", 0.0, "a", None, 0, 100, 10, (1,), 16),
        TraceRequest("c0", 1.0, "c", None, 0, 100, 10, (4,), 16),
    ]
    records = [
        RequestRecord(0.0, 100, 10, 0, 0, 0, first_token=0.5, finish=2.0, trace_index=0),
        RequestRecord(1.0, 100, 10, 0, -1, -1, trace_index=1, router_wait=60.0, refused=True),
    ]
    cols = ss.session_columns(records, reqs)
    assert cols["sessions_running"] == pytest.approx(1.0)  # only a ran, from 0 to 2
    assert cols["wait_first"] == pytest.approx(30.0)  # 0 s and the refused one's 60 s


def test_the_tpot_share_counts_served_requests_with_two_tokens_or_more() -> None:
    records = [
        RequestRecord(0.0, 100, 11, 0, 0, 0, first_token=1.0, finish=1.2),  # 20 ms a token
        RequestRecord(0.0, 100, 11, 0, 0, 0, first_token=1.0, finish=1.5),  # 50 ms
        RequestRecord(0.0, 100, 1, 0, 0, 0, first_token=1.0, finish=1.0),  # one token: no TPOT
        RequestRecord(0.0, 100, 11, 0, -1, -1, router_wait=60.0, refused=True),
    ]
    assert ss.within_tpot_slo(records, 30.0) == pytest.approx(0.5)
    assert ss.within_tpot_slo(records, 60.0) == pytest.approx(1.0)
    assert ss.within_tpot_slo(records[2:], 30.0) == 0.0
