"""`benchmarks.compare --draws`: every router meets the same arrival draws, run draw by draw, and
the report gives each point's spread and the first router's ratio to the best other per draw."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from benchmarks.compare import (
    Run,
    Setup,
    Workload,
    bench_argv,
    build_parser,
    draws_lines,
    knee,
    load_runs,
    plan,
    setup_from,
    slug_of,
    split_decisions,
    stored_run,
)


def result(goodput: float, ttft_p90: float, in_slo: float = 1.0,
           duration: float | None = None) -> dict[str, Any]:  # fmt: skip
    out = {"request_goodput": goodput, "p90_ttft_ms": ttft_p90, "slo_attainment": in_slo}
    return out if duration is None else {**out, "duration": duration}


SETUP = replace(Setup(), routers=("smetric", "smetric/lmetric"), rates=(1.0, 2.0), draws=2)


def test_draws_run_draw_by_draw_with_their_own_seed_and_files() -> None:
    first = [(1, "smetric", 1.0), (1, "smetric", 2.0), (1, "smetric/lmetric", 1.0),
             (1, "smetric/lmetric", 2.0)]  # fmt: skip
    assert plan(SETUP)[:4] == first
    assert {d for d, _, _ in plan(SETUP)} == {1, 2} and len(plan(SETUP)) == 8
    assert slug_of("smetric", 1.0) == slug_of("smetric", 1.0, 1) == "smetric_1"
    assert slug_of("smetric/lmetric", 1.5, 2) == "smetric_lmetric_1_5_d2"

    load = Workload(Path("conversations.json"), {"conversations": 4}, (2, 2, 2, 2))
    argv = bench_argv("py", "http://x", "m", load, SETUP, 1.0, Path("o"), "tok", 2)
    assert argv[argv.index("--seed") + 1] == "2"


def test_the_report_gives_the_spread_and_the_ratio_draw_by_draw() -> None:
    runs = [
        Run("smetric", 1.0, result(10.0, 400), draw=1),
        Run("smetric/lmetric", 1.0, result(8.0, 500), draw=1),
        Run("smetric", 1.0, result(9.0, 600), draw=2),
        Run("smetric/lmetric", 1.0, result(10.0, 300), draw=2),
        Run("smetric", 2.0, result(4.0, 5000, 0.5), draw=1),
        Run("smetric/lmetric", 2.0, result(4.0, 5000, 0.95), draw=1),
        Run("smetric", 2.0, result(4.0, 5000, 0.5), draw=2),
        Run("smetric/lmetric", 2.0, result(4.0, 5000, 0.8), draw=2),
    ]
    text = "\n".join(draws_lines(runs, SETUP))
    row = "| smetric | 1 | 9.50 [9.00–10.00] | 100 % [100–100] | 500 [400–600] | n/a | n/a |"
    assert row in text
    # per draw: 10/8 and 9/10; TTFT 400/500 and 600/300; no run lengths, no split
    assert "| 1 | 1.075 [0.900–1.250] | 1.400 [0.800–2.000] | n/a | n/a |" in text
    # the knee reads the mean of the draws: lmetric's 0.875 at 2 conv/s is out
    assert knee(runs, SETUP) == 1.0


def test_the_goodput_ratio_splits_into_run_length_and_requests_in_slo() -> None:
    # draw 1: same requests in SLO (goodput x length 1000 each), the first's run 10 % shorter;
    # draw 2: same length, the first has 0.9 of the best other's requests in SLO. The best other
    # is the highest goodput (lmetric), not the longest or the lowest-latency run.
    runs = [
        Run("smetric", 1.0, result(10.0, 400, duration=100.0), draw=1),
        Run("smetric/lmetric", 1.0, result(9.0, 500, duration=1000 / 9), draw=1),
        Run("smetric/cache_aware", 1.0, result(5.0, 300, duration=150.0), draw=1),
        Run("smetric", 1.0, result(9.0, 400, duration=100.0), draw=2),
        Run("smetric/lmetric", 1.0, result(10.0, 400, duration=100.0), draw=2),
        Run("smetric/cache_aware", 1.0, result(5.0, 400, duration=200.0), draw=2),
    ]
    setup = replace(SETUP, routers=("smetric", "smetric/lmetric", "smetric/cache_aware"),
                    rates=(1.0,))  # fmt: skip
    text = "\n".join(draws_lines(runs, setup))
    # goodput 10/9 and 0.9; length (1000/9)/100 and 1; in SLO 1.0 and 0.9
    assert "| 1 | 1.006 [0.900–1.111] | 1.167 [1.000–1.333] | 1.056 [1.000–1.111] | " in text
    assert "| 0.950 [0.900–1.000] |" in text


def test_draws_below_one_are_refused() -> None:
    with pytest.raises(SystemExit, match="--draws must be >= 1"):
        setup_from(build_parser().parse_args(["--draws", "0"]))
    assert setup_from(build_parser().parse_args(["--draws", "3"])).draws == 3


def test_a_stored_run_reads_back_and_a_missing_one_is_said(tmp_path: Path) -> None:
    run = Run("smetric/lmetric", 1.5, result(7.0, 900) | {"completed": 40}, 100, 60,
              {"sticky": 3.0}, "cmd", (2, 3), draw=2, router_cpu_s=2.0,
              decide_ms=1.5, decide_stages_ms={"features": 1.2, "decide": 0.3},
              l3_lookups={"hit": 30.0, "timeout": 2.0})  # fmt: skip
    assert run.router_cpu_ms == 50.0
    slug = slug_of(run.router, run.rate, run.draw)
    (tmp_path / f"{slug}.run.json").write_text(json.dumps(run.sidecar()))
    assert stored_run(tmp_path, run.router, 1.5, 2) is None  # no bench_serving output yet
    (tmp_path / f"{slug}.jsonl").write_text(json.dumps(run.result) + "\n")
    assert stored_run(tmp_path, run.router, 1.5, 2) == run
    # a sidecar from before router CPU was recorded reads back without it
    side = run.sidecar()
    del side["router_cpu_s"], side["decide_ms"], side["decide_stages_ms"], side["l3_lookups"]
    (tmp_path / f"{slug}.run.json").write_text(json.dumps(side))
    unrecorded = replace(run, router_cpu_s=None, decide_ms=None, decide_stages_ms={},
                         l3_lookups={})  # fmt: skip
    assert stored_run(tmp_path, run.router, 1.5, 2) == unrecorded
    assert stored_run(tmp_path, run.router, 1.5, 1) is None
    with pytest.raises(SystemExit, match=r"no run of smetric at 1\.5 \(draw 1\)"):
        load_runs(replace(SETUP, routers=("smetric",), rates=(1.5,)), tmp_path)


def test_a_runs_decisions_and_mean_decision_time_come_from_two_scrapes() -> None:
    before = {"sticky": 4.0, "smetric_decision_seconds_sum": 0.5,
              "smetric_decision_seconds_count": 10.0}  # fmt: skip
    before |= {"stage:features": 0.3, "stage:decide": 0.01}
    after = {"sticky": 9.0, "first-turn-balance": 2.0, "smetric_decision_seconds_sum": 0.535,
             "smetric_decision_seconds_count": 17.0, "stage:features": 0.328,
             "stage:decide": 0.017}  # fmt: skip
    made, mean_ms, stages = split_decisions(before, after)
    assert made == {"sticky": 5.0, "first-turn-balance": 2.0}
    assert mean_ms == pytest.approx(5.0)  # 35 ms over 7 decisions
    assert stages == pytest.approx({"features": 4.0, "decide": 1.0})
    # a peer's /metrics has neither
    assert split_decisions({}, {}) == ({}, None, {})


def test_a_router_of_several_processes_has_no_mean_decision_time() -> None:
    # its /metrics scrapes before and after a run may reach different processes
    several = Run("smetric-x4", 1.0, result(8.0, 400), decide_ms=12.0,
                  decide_stages_ms={"features": 11.0}, l3_lookups={"hit": 3.0})  # fmt: skip
    assert several.decide_ms is None and several.decide_stages_ms == {}
    assert several.l3_lookups == {}
    assert Run("smetric", 1.0, result(8.0, 400), decide_ms=12.0).decide_ms == 12.0
