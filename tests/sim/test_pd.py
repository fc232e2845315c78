"""The simulator's PD mode (sim/pd.py): placement by unprefilled tokens, stickiness, TPS, CLI."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from smetric_router.policies import make_policy
from smetric_router.sim.__main__ import main
from smetric_router.sim.cluster import RequestRecord
from smetric_router.sim.config import SimConfig, Slo
from smetric_router.sim.pd import (
    PdCluster,
    PdRunResult,
    summarize_pd,
    trace_pages,
)
from smetric_router.sim.report import document
from smetric_router.traces.schema import TraceRequest
from tests.helpers.policies import ViewRecorder

BS = 16


def _req(
    rid: str,
    t: float,
    session: str,
    turn: int,
    blocks: tuple[int, ...],
    output_len: int = 50,
    history: int = 0,
) -> TraceRequest:
    return TraceRequest(
        req_id=rid,
        arrival_s=t,
        session=session,
        parent=None,
        turn=turn,
        input_len=len(blocks) * BS,
        output_len=output_len,
        block_ids=blocks,
        block_size=BS,
        history_len=history,
    )


def _blocks(tag: int, n: int) -> tuple[int, ...]:
    return tuple(tag * 100_000 + j for j in range(n))


def _cfg(instances: int) -> SimConfig:
    return SimConfig(instances=instances, gpu_kv_tokens=1 << 18, host_kv_tokens=0)


def _run(policy: str, trace: list[TraceRequest], instances: int) -> PdRunResult:
    cfg = _cfg(instances)
    return PdCluster(cfg, make_policy(policy, cfg.params), math.inf).run(trace)


def test_follow_up_sticks_to_its_sessions_prefill_instance() -> None:
    # four sessions' first turns spread over four instances; each follow-up (its history plus
    # new blocks) arrives after the first prefill finished and goes back to the same instance
    trace = []
    for s in range(4):
        first = _blocks(s + 1, 40)
        trace.append(_req(f"s{s}t0", 0.01 * s, f"s{s}", 0, first))
        follow_up = first + _blocks(s + 11, 8)  # carries the first turn's prompt and reply
        trace.append(_req(f"s{s}t1", 5 + 0.01 * s, f"s{s}", 1, follow_up, history=40 * BS + 50))
    res = _run("smetric", trace, 4)
    firsts = [r.instance for r in res.records if r.turn == 0]
    assert sorted(firsts) == [0, 1, 2, 3]
    for r in res.records:
        if r.turn == 1:
            assert r.instance == r.first_instance
            assert r.cached_local == 40 * BS  # the whole carried history from the local tier
    row = summarize_pd(res, Slo(), "smetric", 1.0, math.inf)
    assert row["followup_stickiness"] == 1.0
    assert row["local_hit_ratio"] == pytest.approx(4 * 640 / (4 * 640 + 4 * 768))


def test_unprefilled_tokens_steer_first_turns_away_and_recover_when_drained() -> None:
    long = _req("a", 0.0, "a", 0, _blocks(1, 4000))  # 64K tokens: seconds of prefill
    trace = [
        long,
        _req("b", 0.001, "b", 0, _blocks(2, 64)),
        # by request counts the two instances tie (1 each) and the tick would pick instance 0;
        # by unprefilled tokens instance 0 holds 64K against 1K, so c joins b
        _req("c", 0.002, "c", 0, _blocks(3, 64)),
        # long after every prefill ended both loads are 0 again: d ties (round robin, tick 3 ->
        # instance 1), and while d prefills the drained instance 0 takes first turns again
        _req("d", 100.0, "d", 0, _blocks(4, 64)),
        _req("e", 100.001, "e", 0, _blocks(5, 4)),
    ]
    res = _run("smetric", trace, 2)
    assert [r.instance for r in res.records] == [0, 1, 1, 1, 0]
    assert res.records[0].first_token > res.records[2].first_token  # still prefilling then
    # load_balance (Dynamo-like) reads the same unprefilled-token load
    assert [r.instance for r in _run("load_balance", trace, 2).records][:3] == [0, 1, 1]


def test_prefill_instances_are_shown_as_the_routers_pd_views_show_them() -> None:
    cfg = _cfg(2)
    policy = ViewRecorder(make_policy("smetric", cfg.params))
    trace = [_req("a", 0.0, "a", 0, _blocks(1, 64)), _req("b", 0.001, "b", 0, _blocks(2, 64))]
    PdCluster(cfg, policy, math.inf).run(trace)
    workers = [x for view in policy.views for x in view.workers]
    assert len(policy.views) == 2 and all(x.prefill_only and x.running is None for x in workers)
    # the second request sees the first one's prompt queued, in tokens
    assert sorted(x.load for x in policy.views[1].workers) == [0, 64 * BS]


def test_prefill_tps_accounting_by_hand() -> None:
    slo = Slo(ttft_base_s=1.0, ttft_per_token_ms=1.0, tpot_ms=30.0)
    recs = [
        # TTFT 1.5 s <= 1 + 1 s: within; computed tokens and reused ones count alike
        RequestRecord(0.0, 1000, 300, 0, 0, 0, 600, 100, first_token=1.5, finish=1.5),
        # TTFT 2.5 s > 2 s: misses
        RequestRecord(0.5, 1000, 300, 1, 0, 0, 0, 0, first_token=3.0, finish=3.0),
        # a prompt that could never fit: dropped, no TTFT, no tokens
        RequestRecord(1.0, 10**6, 5, 0, 1, 1),
    ]
    row = summarize_pd(PdRunResult(recs, [[100.0, 300.0], [0.0, 0.0]], 30.0), slo, "x", 1, 0)
    assert row["prefill_tps"] == row["tps"] == pytest.approx(2000 / 3.0)  # span 0 -> 3 s
    assert row["prefill_tps_within_slo"] == row["tps_within_slo"] == pytest.approx(1000 / 3.0)
    assert row["ttft_p50"] == pytest.approx(2.0)
    assert math.isnan(row["tpot_p50"])
    assert row["reuse_ratio"] == pytest.approx(700 / (2000 + 10**6))
    assert row["imbalance_mean"] == pytest.approx(1.5)  # the empty window is left out
    assert row["followup_stickiness"] == 1.0
    assert row["mode"] == "pd"


def test_one_prefill_takes_one_step_of_the_timing_model() -> None:
    cfg = _cfg(1)
    cluster = PdCluster(cfg, make_policy("smetric", cfg.params), math.inf)
    res = cluster.run([_req("a", 0.0, "a", 0, _blocks(1, 64))])
    expected = cluster.timing.step_seconds([(0, 1024)], 0, 0)
    rec = res.records[0]
    assert rec.first_token == pytest.approx(expected)
    row = summarize_pd(res, Slo(), "smetric", 1.0, math.inf)
    assert row["prefill_tps"] == pytest.approx(1024 / expected)
    # the time-averaged unprefilled load: 1024 tokens for `expected` s of the first window
    assert res.window_load == [[pytest.approx(1024 * expected / cfg.window_s)]]


def test_same_seed_same_rows_and_precomputed_pages_change_nothing() -> None:
    trace = []
    for s in range(6):
        hist = _blocks(s + 1, 30)
        for k in range(3):
            hist = hist + _blocks(100 + 10 * s + k, 6)
            trace.append(_req(f"s{s}t{k}", 0.2 * s + 0.7 * k, f"s{s}", k, hist))
    cfg = _cfg(3)
    rows = []
    for pages in (None, None, trace_pages(trace, BS)):
        res = PdCluster(cfg, make_policy("random", cfg.params), 1.6).run(trace, 2.0, None, pages)
        rows.append(summarize_pd(res, cfg.slo, "random", 2.0, 1.6))
    docs = [document([r]) for r in rows]  # NaN-free (tpot is undefined under PD)
    assert docs[0] == docs[1] == docs[2]
    assert rows[0]["global_hit_ratio"] > 0  # the random placement did use the global tier


def test_cli_pd_writes_prefill_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.jsonl"
    with path.open("w") as f:
        for s in range(4):
            for k in range(2):
                row = {
                    "chat_id": 10 * s + k,
                    "parent_chat_id": 10 * s + k - 1 if k else -1,
                    "timestamp": s * 0.1 + 3 * k,
                    "input_length": 48 * BS * (k + 1),
                    "output_length": 30,
                    "type": "text",
                    "turn": k + 1,
                    "hash_ids": list(_blocks(s + 1, 48 * (k + 1))),
                }
                f.write(json.dumps(row) + "\n")
    out = tmp_path / "o.json"
    args = ["--trace", str(path), "--pd", "--instances", "2", "--policies", "smetric,bailian"]
    assert main([*args, "--global-ratio", "0,inf", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert len(doc["results"]) == 4
    for r in doc["results"]:
        assert r["mode"] == "pd" and r["tpot_p50"] is None
        assert r["prefill_tps"] > 0 and r["prefill_tps_within_slo"] <= r["prefill_tps"]
    assert "max TPS within SLO" in capsys.readouterr().out
    assert main(["--trace", str(path), "--pd", "--policies", "cache_aware"]) == 2
    assert "not modelled under --pd" in capsys.readouterr().err
    assert main(["--trace", str(path), "--pd", "--follow-ups", "on-reply"]) == 2
    assert "--follow-ups on-reply is not modelled under --pd" in capsys.readouterr().err


@pytest.mark.parametrize("tier_mode", ["paper", "hicache"])
def test_pd_rows_carry_the_tier_mode_and_the_tokens_computed_per_window(tier_mode: str) -> None:
    cfg = replace(_cfg(2), tier_mode=tier_mode, window_s=0.05)
    cluster = PdCluster(cfg, make_policy("round_robin", cfg.params), 1.0)
    trace = [_req(f"r{k}", 0.03 * k, f"s{k}", 0, _blocks(k + 1, 64)) for k in range(6)]
    res = cluster.run(trace)
    row = summarize_pd(res, Slo(), "round_robin", 1.0, 1.0)
    assert row["tier_mode"] == tier_mode
    computed = sum(i.engine.prefill_tokens_computed for i in cluster.instances)
    assert len(row["windows"]) > 1
    assert sum(map(sum, row["windows"])) == computed + len(trace)  # + each first token
