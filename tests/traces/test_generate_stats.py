"""Generator determinism and calibration; the stats definitions on a hand-made trace."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from smetric_router.traces.generate import GenConfig, generate
from smetric_router.traces.loaders import load_bailian, load_trace
from smetric_router.traces.schema import TraceRequest
from smetric_router.traces.stats import compute_stats


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gen") / "agentic.jsonl"
    generate(GenConfig(sessions=300, seed=0), out)
    return out


def test_same_seed_same_file_other_seed_differs(trace: Path, tmp_path: Path) -> None:
    again, other = tmp_path / "again.jsonl", tmp_path / "other.jsonl"
    generate(GenConfig(sessions=300, seed=0), again)
    generate(GenConfig(sessions=300, seed=1), other)
    assert again.read_bytes() == trace.read_bytes()
    assert other.read_bytes() != trace.read_bytes()


def test_generated_trace_is_valid_bailian_with_sessions(trace: Path) -> None:
    reqs = load_trace(trace)
    assert [r.req_id for r in reqs] == [str(i) for i in range(len(reqs))]
    by_id = {r.req_id: r for r in reqs}
    for r in reqs:
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


def test_generated_trace_lands_in_the_papers_ranges(trace: Path) -> None:
    st = compute_stats(load_trace(trace))
    assert st.reuse_ratio >= 0.80
    assert 0.55 <= st.intra_session_share <= 0.80
    assert 0.12 <= st.system_prompt_share <= 0.25
    assert st.reuse_within["100s"] >= 0.85
    assert st.reuse_within["100s"] < 0.99  # a tail beyond 100 s exists
    mix = st.trigger_mix
    assert mix["agent"] > 0.5 and mix["user"] > 0.05
    assert st.top3pct_token_share > 0.1


def test_compaction_restarts_from_the_system_prompt(tmp_path: Path) -> None:
    out = tmp_path / "long.jsonl"
    cfg = GenConfig(sessions=40, seed=3, long_session_p=1.0, compact_at_tokens=(70_000, 80_000))
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
    assert st.intra_session_share == pytest.approx((8 + 14) / reused)
    assert st.system_prompt_share == pytest.approx(4 / reused)
    assert st.other_inter_share == pytest.approx(12 / reused)
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
        [*run, "stats", str(out), "--instances", "4", "--json", str(js)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "reuse ratio" in proc.stdout and "system prompt" in proc.stdout
    data = json.loads(js.read_text())
    assert data["instances"] == 4 and data["requests"] == len(load_trace(out))
