"""Generator determinism and calibration; the stats definitions on a hand-made trace."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from smetric_router.traces.generate import GenConfig, generate
from smetric_router.traces.loaders import load_bailian, load_trace
from smetric_router.traces.schema import TraceRequest
from smetric_router.traces.stats import compute_stats


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gen") / "agentic.jsonl"
    generate(SMALL, out)
    return out


# A small window at 4 instances (the warm-up's cost scales with the rate, not the window).
SMALL = GenConfig(sessions=60, seed=0, instances=4)


def test_same_seed_same_file_other_seed_differs(trace: Path, tmp_path: Path) -> None:
    again, other = tmp_path / "again.jsonl", tmp_path / "other.jsonl"
    generate(SMALL, again)
    generate(replace(SMALL, seed=1), other)
    assert again.read_bytes() == trace.read_bytes()
    assert other.read_bytes() != trace.read_bytes()


def test_generated_trace_is_valid_bailian_with_sessions(trace: Path) -> None:
    reqs = load_trace(trace)
    assert [r.req_id for r in reqs] == [str(i) for i in range(len(reqs))]
    by_id = {r.req_id: r for r in reqs}
    cut = 0  # follow-ups whose earlier turns fell before the window
    for r in reqs:
        if r.parent is not None and r.parent not in by_id:
            cut += 1
            assert r.turn > 0 and r.session == r.parent
            continue
        assert r.trigger in ("agent", "user", "compaction")
        assert 1 <= r.output_len <= 2000
        if r.parent is not None:
            p = by_id[r.parent]
            assert p.session == r.session and p.arrival_s <= r.arrival_s and r.turn == p.turn + 1
            if r.trigger != "compaction":  # a follow-up re-sends its parent's full blocks
                full = len(p.block_ids) - (p.input_len % 16 > 0)
                assert r.block_ids[:full] == p.block_ids[:full]
    # Forked sub-agents: new chains whose first request is a follow-up turn carrying a parent's
    # context, and compaction turns that restart from the system prompt.
    forks = [r for r in reqs if r.parent is None and r.turn > 0]
    assert forks and all(r.trigger == "agent" for r in forks)
    assert max(r.input_len for r in reqs) > 50_000
    assert cut > 0 and min(r.arrival_s for r in reqs) >= 0.0


def test_generated_trace_lands_in_the_papers_ranges(trace: Path) -> None:
    st = compute_stats(load_trace(trace), instances=4)
    assert st.reuse_ratio >= 0.80
    assert 0.55 <= st.intra_session_share <= 0.80
    assert 0.10 <= st.system_prompt_share <= 0.25  # 16 % at 32 instances; fewer sessions here
    assert st.reuse_within["100s"] >= 0.85
    assert st.reuse_within["100s"] < 0.99  # a tail beyond 100 s exists
    mix = st.trigger_mix
    assert mix["agent"] > 0.5 and 0.01 < mix["user"] < 0.2
    assert st.top3pct_token_share > 0.1
    # The recalibrated generator's shape, as published agent traces have it: long sessions, few
    # first requests, tens of small templates.
    assert st.first_request_share <= 0.05 and st.chain_start_share <= 0.10
    assert st.shared_ge20_token_share <= 0.15
    assert st.turns_median >= 15
    assert 35 <= st.rpm_per_instance_mean <= 50 and st.rpm_per_instance_min >= 25


def test_agent_loops_have_a_turn_and_the_knob_median(tmp_path: Path) -> None:
    # One user message per session, no forks, no compaction: turns = 1 + the loop's draw.
    cfg = replace(
        SMALL,
        sessions=400,
        warmup_s=0.0,
        user_continue_p=0.0,
        long_session_p=0.0,
        fork_p=0.0,
        duration_s=1e9,  # every session whole inside the window
    )
    for median in (1.0, 12.0):
        out = tmp_path / f"m{median:g}.jsonl"
        generate(replace(cfg, loop_turns_median=median), out)
        per = Counter(r.session for r in load_trace(out))
        loop = np.array(list(per.values())) - 1
        assert loop.min() >= 1
        assert abs(float(np.median(loop)) - median) <= 0.15 * median + 0.5


def test_window_is_a_steady_state(tmp_path: Path) -> None:
    out = tmp_path / "w.jsonl"
    generate(replace(SMALL, sessions=100), out)
    reqs = load_trace(out)
    t = np.array([r.arrival_s for r in reqs])
    halves = [reqs[: len(reqs) // 2], reqs[len(reqs) // 2 :]]
    first = [sum(r.turn == 0 for r in h) / len(h) for h in halves]
    # Without a warm-up the window opens with young sessions: first requests crowd its start.
    assert abs(first[0] - first[1]) < 0.03
    rate = np.histogram(t, bins=4)[0]
    assert rate.min() > 0.7 * rate.max()
    young = tmp_path / "young.jsonl"
    generate(replace(SMALL, sessions=100, warmup_s=0.0), young)
    yreqs = load_trace(young)
    yfirst = sum(r.turn == 0 for r in yreqs[: len(yreqs) // 2]) / (len(yreqs) // 2)
    assert yfirst > 2 * first[0]


def test_lead_in_precedes_the_same_window_and_warms_the_store(tmp_path: Path) -> None:
    plain, led = tmp_path / "plain.jsonl", tmp_path / "led.jsonl"
    generate(replace(SMALL, sessions=100), plain)
    generate(replace(SMALL, sessions=100, lead_in_s=600.0), led)
    window = load_trace(plain)
    lead = load_trace(led)
    later = [r for r in lead if r.arrival_s >= 600.0]
    assert len(lead) > len(later) == len(window)

    def shape(r: TraceRequest, shift: float) -> tuple[object, ...]:
        return (round(r.arrival_s - shift, 3), r.input_len, r.output_len, r.trigger, r.block_ids)

    assert [shape(r, 600.0) for r in later] == [shape(r, 0.0) for r in window]
    cold = compute_stats(window, instances=4)
    warm = compute_stats(lead, instances=4, from_s=600.0)
    assert warm.requests == cold.requests and warm.prompt_tokens == cold.prompt_tokens
    assert warm.reuse_ratio > cold.reuse_ratio + 0.02  # carried-over histories now hit


def test_compaction_restarts_from_the_system_prompt(tmp_path: Path) -> None:
    out = tmp_path / "long.jsonl"
    cfg = GenConfig(
        sessions=40,
        seed=3,
        warmup_s=0.0,
        duration_s=1e6,  # whole sessions
        long_session_p=1.0,
        compact_at_tokens=(70_000, 80_000),
    )
    generate(cfg, out)
    reqs = load_bailian(out)
    by_id = {r.req_id: r for r in reqs}
    compactions = [r for r in reqs if r.trigger == "compaction"]
    assert compactions
    for r in compactions:
        p = by_id[r.parent] if r.parent else None
        assert p is not None and r.input_len < p.input_len
        assert r.block_ids[:10] == p.block_ids[:10]  # the shared system prompt
        assert r.block_ids[-2] not in p.block_ids  # fresh summary: the chain breaks


def req(
    i: int, t: float, session: str, turn: int, blocks: tuple[int, ...], trigger: str | None = None
) -> TraceRequest:
    return TraceRequest(
        req_id=str(i),
        arrival_s=t,
        session=session,
        parent=None,
        turn=turn,
        input_len=len(blocks) * 4 - 2,  # the last block holds 2 of 4 tokens
        output_len=10,
        block_ids=blocks,
        block_size=4,
        trigger=trigger,
    )


def test_stats_definitions_on_a_hand_made_trace() -> None:
    reqs = [
        req(0, 0.0, "a", 0, (1, 2, 3), "user"),  # new: 10 tokens
        req(1, 5.0, "a", 1, (1, 2, 4, 5), "agent"),  # intra: blocks 1, 2 (8 tokens)
        req(2, 50.0, "b", 0, (1, 6), "user"),  # system prompt: block 1 (4 tokens)
        req(3, 200.0, "c", 3, (1, 2, 4, 7), "agent"),  # fork: other inter, blocks 1, 2, 4 (12)
        req(4, 4000.0, "c", 4, (1, 2, 4, 7), "compaction"),  # intra: all, last block 2 tokens
    ]
    st = compute_stats(reqs, instances=2)
    assert st.prompt_tokens == 10 + 14 + 6 + 14 + 14
    reused = 8 + 4 + 12 + 14
    assert st.reuse_ratio == pytest.approx(reused / st.prompt_tokens)
    # By origin session: block 1 is a template (b's first request re-used it from a), so c
    # re-using it is system prompt; c's blocks 2, 4 came from a (other); c's block 7 is its own.
    assert st.intra_session_share == pytest.approx((8 + 2) / reused)
    assert st.system_prompt_share == pytest.approx((4 + 4 + 4) / reused)
    assert st.other_inter_share == pytest.approx((8 + 8) / reused)
    assert st.first_request_share == pytest.approx(2 / 5)
    assert st.one_request_session_share == pytest.approx(1 / 3)
    assert st.turns_median == 2.0 and st.requests_per_session == pytest.approx(5 / 3)
    # Intervals since the last holder: 5, 5 | 45 | 150, 150, 195 | 3800 x 4 (of 10 blocks).
    assert st.reuse_within == pytest.approx({"10s": 0.2, "100s": 0.3, "3600s": 0.6})
    assert st.trigger_mix == pytest.approx({"agent": 0.4, "compaction": 0.2, "user": 0.4})
    # 66 full minutes: [0, 60) holds 3 requests, [180, 240) holds 1, others none.
    assert st.rpm_per_instance_mean == pytest.approx(4 / 66 / 2)
    assert st.rpm_per_instance_min == 0.0
    assert st.top3pct_token_share == pytest.approx((14 + 14 + 20) / (10 + 14 + 6 + 14 + 14 + 50))
    assert st.sessions == 3


def test_cli_generate_then_stats_json(tmp_path: Path) -> None:
    out, js = tmp_path / "g.jsonl", tmp_path / "s.json"
    run = [sys.executable, "-m", "smetric_router.traces"]
    gen = [*run, "generate", "--sessions", "20", "--seed", "4", "--out", str(out)]
    subprocess.run(gen, check=True, capture_output=True, timeout=60)
    proc = subprocess.run(
        [*run, "stats", str(out), "--instances", "4", "--json", str(js), "--compare", str(out)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "reuse ratio" in proc.stdout and "system prompt" in proc.stdout
    head = proc.stdout.splitlines()[0].split()
    assert head[-2:] == ["paper", "§3"] and "g" in head  # this trace, the compared one, the paper
    assert "~67 %" in proc.stdout
    data = json.loads(js.read_text())
    assert data["instances"] == 4 and data["requests"] == len(load_trace(out))
