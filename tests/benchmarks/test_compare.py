"""`python -m benchmarks.compare` end to end at its smallest size: 2 emulated workers, one router of
each kind (smetric-router, smg, sglang-router), 4 conversations, one rate, driven by SGLang's own
bench_serving from the CPU SGLang env. Catches a broken harness (converter, router command lines,
bench_serving flags, the report), not a slow router. It runs the agent shape (`--agent`: tool
definitions on every request, and the structured tool-call sessions through each router)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.mooncake_keys import require_mooncake
from tests.sglang_env import require_sglang_python
from tests.shared_ref import require_shared

pytestmark = pytest.mark.sglang


def test_smallest_comparison_end_to_end(tmp_path: Path) -> None:
    require_sglang_python()
    from benchmarks.compare import SMOKE, main

    runs = main(["--smoke", "--agent", "--tool-sessions", "4", "--work-dir", str(tmp_path / "work"),
                 "--out-dir", str(tmp_path)])  # fmt: skip
    assert [r.router for r in runs] == list(SMOKE.routers)
    kinds = {r.router.split("/")[0] for r in runs}
    assert kinds == {"smetric", "smg", "sglang-router"}
    turns = runs[0].result["completed"]
    assert turns > len(runs) and all(r.result["completed"] == turns for r in runs)
    for r in runs:
        assert not any(r.result["errors"]), (r.router, r.result["errors"])
        assert r.result["request_goodput"] > 0 and r.result["p90_ttft_ms"] > 0
        # follow-ups re-send their history: the workers served part of every run from cache
        assert r.cached_share is not None and 0 < r.cached_share < 1, r.router
        # every router's process tree did the proxying: it spent CPU on each request
        assert r.router_cpu_ms is not None and r.router_cpu_ms > 0, r.router
    smetric = next(r for r in runs if r.router == "smetric")
    assert smetric.stickiness is not None and smetric.decisions.get("first-turn-balance", 0) > 0
    assert all(r.stickiness is None for r in runs if r.router != "smetric")
    # smetric-router reports how long its decisions took; the peers do not
    assert smetric.decide_ms is not None and smetric.decide_ms > 0
    assert all(r.decide_ms is None for r in runs if r.router.split("/")[0] != "smetric")
    # tool calls: every router's follow-ups found their previous prompt where they ran (the
    # emulated workers render as the router does; real SGLang workers are the test of that)
    for r in runs:
        assert r.tool_calls["followups"] == 12 and r.tool_calls["prompt_covered"] == 1.0, r
    assert smetric.tool_calls["sticky"] == 12
    md = (tmp_path / "compare-smoke.md").read_text()
    for r in runs:
        assert f"| {r.router} | " in md
        assert f"{r.router_cpu_ms:.1f} |" in md
    assert "Structured tool calls" in md
    for png in ("compare-smoke_goodput.png", "compare-smoke_ttft_cdf.png"):
        assert (tmp_path / png).stat().st_size > 1000


def test_mooncake_mode_end_to_end(tmp_path: Path) -> None:
    """bench_serving's own Mooncake replay (native backend, /generate text prompts) of the shared
    trace's first records, rounds per session, through smetric-router and smg."""
    require_sglang_python()
    from benchmarks.compare import MOONCAKE_TRACE, main

    require_shared(MOONCAKE_TRACE)
    runs = main(["--smoke", "--dataset", "mooncake", "--rounds", "2", "--conversations", "3",
                 "--routers", "smetric,smg/cache_aware", "--rates", "1",
                 "--work-dir", str(tmp_path / "work"), "--out-dir", str(tmp_path)])  # fmt: skip
    for r in runs:
        assert r.result["completed"] == 6 and not any(r.result["errors"]), r.router
        assert "--dataset-name mooncake" in r.command and "--backend sglang " in r.command
        assert r.prompt_tokens > 0  # the workers counted the /generate prompts
    md = (tmp_path / "compare-smoke.md").read_text()
    assert "Mooncake replay" in md and "--mooncake-num-rounds 2" in md


def test_pd_with_a_mooncake_tier_end_to_end(tmp_path: Path) -> None:
    """launch/emulated-pd-mooncake.yaml (4 prefill and 2 decode instances, a real Mooncake
    master): smetric-router and smg each in front of both roles, the store emptied through the
    prefill instances before each run (a decode instance has no store to clear)."""
    require_sglang_python()
    require_mooncake()
    from benchmarks.compare import main

    runs = main(["--smoke", "--config", "launch/emulated-pd-mooncake.yaml",
                 "--routers", "smetric,smg/cache_aware", "--work-dir", str(tmp_path / "work"),
                 "--out-dir", str(tmp_path)])  # fmt: skip
    assert [r.router for r in runs] == ["smetric", "smg/cache_aware"]
    for r in runs:
        assert r.result["completed"] == sum(r.turns) and not any(r.result["errors"]), r.router
        # the prefill instances served follow-ups' histories from a tier
        assert r.cached_share is not None and r.cached_share > 0, r.router
    assert runs[0].decisions.get("first-turn-balance", 0) > 0
    md = (tmp_path / "compare-smoke.md").read_text()
    assert "disaggregated, 4 prefill and 2 decode" in md and "mooncake_master" in md


@pytest.mark.parametrize(
    ("router", "shown"),
    [("smetric", True), ("smetric/smetric-paper", True), ("smetric-x4", False),
     ("smetric/lmetric", False)],
)  # fmt: skip
def test_stickiness_is_shown_for_the_sticky_policies_of_one_process(
    router: str, shown: bool
) -> None:
    from benchmarks.compare import Run

    run = Run(
        router, 1.0, {}, decisions={"first-turn-balance": 4, "sticky": 3, "evicted-fallback": 1}
    )
    assert run.stickiness == (0.75 if shown else None)


def test_stickiness_under_pd_leaves_the_decode_sides_decisions_out() -> None:
    from benchmarks.compare import Run

    # the router counts its decode decisions too, under the decode policy's name
    decisions: dict[str, float] = {"first-turn-balance": 4, "least_tokens": 10, "sticky": 3,
                                   "l3-move": 2, "evicted-fallback": 1}  # fmt: skip
    assert Run("smetric", 1.0, {}, decisions=decisions).stickiness == 0.5


def test_device_shares_split_first_turns_from_follow_ups() -> None:
    from benchmarks.compare import Run

    # two conversations of 2 and 1 turns, in bench_serving's order (conversation by conversation)
    result = {
        "input_lens": [100, 300, 200],
        "cached_tokens_details": [
            {"device": 10, "host": 0, "storage": 40},
            {"device": 150, "host": 0, "storage": 100},
            None,  # a first turn with nothing cached
        ],
    }
    run = Run("smetric", 1.0, result, turns=(2, 1))
    assert run.device_shares == (10 / 300, 150 / 300)
    # a router that drops sglext (sglang-router 0.3.2): no details, no figure
    bare = Run("sglang-router/cache_aware", 1.0, {"input_lens": [100, 300, 200],
               "cached_tokens_details": [None, None, None]}, turns=(2, 1))  # fmt: skip
    assert bare.device_shares is None
    # outputs that do not match the conversations cannot be split
    assert Run("smetric", 1.0, result, turns=(2, 2)).device_shares is None


def test_turn_ttfts_split_first_turns_from_follow_ups_and_skip_failures() -> None:
    from benchmarks.compare import Run, Setup, turn_lines

    # conversations of 3 and 2 turns in bench_serving's order; the second's follow-up failed
    result = {
        "ttfts": [9.0, 1.0, 2.0, 3.0, 0.0],
        "errors": ["", "", "", "", "worker died"],
    }
    run = Run("smetric", 2.0, result, turns=(3, 2))
    assert run.turn_ttfts == ([9.0, 3.0], [1.0, 2.0])
    assert Run("smetric", 2.0, result, turns=(3, 3)).turn_ttfts is None
    setup = Setup(routers=("smetric",), slo_ttft_ms=8000)
    row = turn_lines([run], setup)[-1]
    # first turns: p50 6000, p90 8400, one of two over 8 s; follow-ups 1500 / 1900, none over
    assert row == "| smetric | 2 | 1 | 6000 / 8400 | 50 % | 1500 / 1900 | 0 % |"
    assert turn_lines([Run("smetric", 2.0, {}, turns=(3, 2))], setup) == []
