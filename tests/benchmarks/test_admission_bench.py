"""`python -m benchmarks.admission`: how its client plans sessions and adds up records (fast),
and the `--quick` mode end to end with a smaller flood: emulated workers, smetric-router with
admission on and off, smg with its queue, a calibration and a flood. Catches a broken harness
(router command lines, the client, the report), not a slow router."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from benchmarks.admission import QUICK, derive
from benchmarks.admission_load import Attempt, Records, SessionResult, plan_sessions
from benchmarks.admission_report import ON
from benchmarks.admission_stats import stats
from tests.sglang_env import require_sglang_python


def test_a_burst_tenant_arrives_as_launches_of_sub_agents() -> None:
    plans = plan_sessions({"alpha": 2.0, "swarm": 2.0}, {"swarm": 8}, 200.0, seed=3)
    swarm = [p for p in plans if p.tenant == "swarm"]
    launches = Counter(p.parent for p in swarm)
    assert set(launches.values()) == {8}  # every launch is 8 sub-agents at one instant
    assert all(len({p.start_s for p in swarm if p.parent == k}) == 1 for k in launches)
    alpha = [p for p in plans if p.tenant == "alpha"]
    assert all(p.parent is None for p in alpha)
    # both tenants offer about their rate in sessions, bursts or not
    assert 300 < len(alpha) < 500 and 300 < len(swarm) < 500
    assert [p.start_s for p in plans] == sorted(p.start_s for p in plans)


def _attempt(turn: int, outcome: str, ttft: float | None = 0.1, status: int = 200,
             retry_after: float | None = None, turn_start: float = 0.0,
             start: float = 0.0) -> Attempt:  # fmt: skip
    return Attempt("alpha", 0, turn, 0, outcome, status, turn_start, start, start + 1, ttft,
                   retry_after)  # fmt: skip


def test_a_retried_turn_counts_its_wait_and_refusals_are_told_apart() -> None:
    rec = Records(
        [
            _attempt(0, "shed", None, 429, 2.0),
            _attempt(0, "ok", 0.1, start=2.0),  # retried after Retry-After: TTFT 2.1 s wall
            _attempt(1, "ok", 0.1, turn_start=3.0, start=3.0),
            _attempt(2, "shed", None, 503),  # a queue timeout answered 503, no Retry-After
            _attempt(2, "error", None, 200),  # admitted, then cut: lost
        ],
        [SessionResult("alpha", 0, 0.0, 4.0, "failed", 2)],
    )
    r = stats("x", 2.0, rec, run_s=10.0, speedup=0.5, slo_ttft_s=0.5)
    assert r.ok == 2 and r.in_slo == 1  # 2.1 s wall = 1.05 s model is out of SLO
    assert r.shed == 2 and r.shed_429_with_retry_after == 1 and r.lost == 1
    assert r.first_ttft_p50_s == pytest.approx(1.05) and r.follow_ttft_p50_s == pytest.approx(0.05)
    assert r.goodput == pytest.approx(1 / 5.0)  # one request in SLO over 5 model seconds
    assert r.tenants["alpha"]["share"] == 1.0


def test_admission_settings_follow_the_cluster() -> None:
    s = derive(QUICK, req_s=5.3, mean_request_s=1.0)
    assert s.max_concurrent == QUICK.workers * (QUICK.max_running + 1)
    assert s.queue_timeout_s == 2 * QUICK.slo_ttft_s / QUICK.speedup
    assert s.queue_size >= s.max_concurrent and s.smg_rate == 6


@pytest.mark.sglang
def test_quick_mode_end_to_end(tmp_path: Path) -> None:
    require_sglang_python()
    from benchmarks.admission import main

    out = tmp_path / "admission-quick.md"
    # admission on alone: the harness around it is the same for every contender, and each one
    # more costs ~20 s of the suite (the full run compares all of them)
    result = main(["--quick", "--contenders", ON, "--window-s", "8", "--drain-s", "4",
                   "--flood", "300", "--out", str(out),
                   "--work-dir", str(tmp_path / "work")])  # fmt: skip
    assert [r.router for r in result.runs] == [ON]
    on = next(r for r in result.runs if r.router == ON)
    assert on.sessions > 0 and on.ok > 0 and on.lost == 0
    # every request smetric-router refused is a 429 saying when to come back
    assert on.shed == on.shed_429_with_retry_after
    assert all(reason.startswith("429 ") for reason in on.shed_reasons)
    fl = result.flood
    assert fl is not None and fl.served_after and fl.queued_after == 0 and fl.running_after == 0
    md = out.read_text()
    assert f"| {ON} | 2× |" in md
    assert "Modelled time on emulated H20 workers" in md and "One run per point" in md
    for png in ("goodput", "ttft", "tenants"):
        assert (tmp_path / f"admission-quick_{png}.png").stat().st_size > 1000
