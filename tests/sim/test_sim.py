"""The simulator on tiny traces: placement, global tier, SLO accounting, determinism, CLI errors."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from smetric_router.core.types import ClusterView, Decision, RequestFeatures
from smetric_router.policies import make_policy
from smetric_router.policies.session_home import rank
from smetric_router.sim.__main__ import main, run
from smetric_router.sim.cluster import Cluster, RequestRecord, RunResult, router_features
from smetric_router.sim.config import SimConfig, Slo
from smetric_router.sim.metrics import summarize
from smetric_router.sim.pd import PdCluster
from smetric_router.traces.loaders import with_carried_history
from smetric_router.traces.schema import TraceRequest

BS = 16
SMALL = SimConfig(instances=4, gpu_kv_tokens=1 << 16, host_kv_tokens=0)


def _sessions(n_sessions: int, turns: int, gap_s: float = 5.0) -> list[TraceRequest]:
    """Sessions sharing a 4-block system prompt; each turn re-sends the history plus 20 blocks.
    First turns arrive 10 ms apart, so they are all in flight together."""
    out = []
    for s in range(n_sessions):
        blocks: tuple[int, ...] = (0, 1, 2, 3)
        for k in range(turns):
            blocks = blocks + tuple(1000 * (s + 1) + 20 * k + j for j in range(20))
            out.append(
                TraceRequest(
                    req_id=f"s{s}t{k}",
                    arrival_s=s * 0.01 + k * gap_s,
                    session=f"s{s}",
                    parent=f"s{s}t{k - 1}" if k else None,
                    turn=k,
                    input_len=len(blocks) * BS - 3,
                    output_len=40,
                    block_ids=blocks,
                    block_size=BS,
                )
            )
    return with_carried_history(out)


def _placement(policy: str, trace: list[TraceRequest]) -> dict[str, list[int]]:
    res = Cluster(SMALL, make_policy(policy), math.inf).run(trace)
    by_session: dict[str, list[int]] = {}
    order = sorted(range(len(trace)), key=lambda i: (trace[i].arrival_s, i))
    for rec, i in zip(res.records, order, strict=True):
        by_session.setdefault(trace[i].session, []).append(rec.instance)
    return by_session


class _BatchSpy:
    """round_robin, noting per decision each view's (running, load) beside what the instance's
    engine reports running (its /v1/loads num_running_reqs) at that moment."""

    name = "batch-spy"
    uses_text_tree = False

    def __init__(self) -> None:
        self.inner = make_policy("round_robin")
        self.cluster: Cluster | PdCluster | None = None
        self.seen: list[tuple[int | None, float, int]] = []

    def needs_l3(self, features: RequestFeatures, view: ClusterView) -> bool:
        return False

    def decide(self, features: RequestFeatures, view: ClusterView) -> Decision:
        assert self.cluster is not None
        for v, inst in zip(view.workers, self.cluster.instances, strict=True):
            self.seen.append((v.running, v.load, inst.engine.load().num_running_reqs))
        return self.inner.decide(features, view)


def test_the_views_running_is_the_engines_running_batch() -> None:
    # 2 running slots per instance and 4 sessions' turns in flight together: some wait queued
    cfg = replace(SMALL, instances=2, max_running_requests=2)
    spy = _BatchSpy()
    spy.cluster = Cluster(cfg, spy, math.inf)
    spy.cluster.run(_sessions(6, 3, gap_s=0.05))
    assert spy.seen
    assert all(running == engine for running, _, engine in spy.seen)
    assert any(running and running > 0 for running, _, _ in spy.seen)
    # queued requests are in flight for the router but not in the batch
    assert any(running is not None and running < load for running, load, _ in spy.seen)


def test_pd_views_carry_no_running_count() -> None:
    cfg = replace(SMALL, instances=2)
    spy = _BatchSpy()
    spy.cluster = PdCluster(cfg, spy, math.inf)
    spy.cluster.run(_sessions(2, 2))
    assert spy.seen and all(running is None for running, _, _ in spy.seen)


def test_smetric_spreads_first_turns_and_sticks_follow_ups() -> None:
    placed = _placement("smetric", _sessions(4, 3))
    assert sorted(p[0] for p in placed.values()) == [0, 1, 2, 3]
    assert all(len(set(p)) == 1 for p in placed.values())


def test_load_balance_moves_follow_ups_and_stickiness_shows_it() -> None:
    trace = _sessions(4, 3)
    placed = _placement("load_balance", trace)
    assert any(len(set(p)) > 1 for p in placed.values())
    rows = run(trace, ["smetric", "load_balance"], [1.0], [math.inf], SMALL)
    sticky = {r["policy"]: r["followup_stickiness"] for r in rows}
    assert sticky["smetric"] == 1.0
    assert sticky["load_balance"] < 1.0


def test_global_tier_serves_follow_ups_that_moved() -> None:
    # round robin over 3 instances moves every follow-up of these 4 sessions
    cfg = SimConfig(instances=3, gpu_kv_tokens=1 << 16, host_kv_tokens=0)
    trace = _sessions(4, 3)
    rows = run(trace, ["round_robin"], [1.0], [0.0, math.inf], cfg)
    none, full = rows
    assert none["global_hit_ratio"] == 0.0
    assert full["global_hit_ratio"] > 0.3
    assert full["reuse_ratio"] > none["reuse_ratio"]


def test_slo_accounting_by_hand() -> None:
    slo = Slo(ttft_base_s=1.0, ttft_per_token_ms=1.0, tpot_ms=30.0)
    recs = [
        # TTFT 1.5 s <= 1 + 1000 * 1 ms = 2 s; TPOT (3.5 - 1.5) / 100 = 20 ms: meets both
        RequestRecord(0.0, 1000, 101, 0, 0, 0, 0, 0, first_token=1.5, finish=3.5),
        # TTFT 2.5 s > 2 s: misses
        RequestRecord(0.0, 1000, 101, 0, 1, 1, 0, 0, first_token=2.5, finish=4.0),
        # TTFT fine, TPOT (5 - 1) / 100 = 40 ms > 30 ms: misses
        RequestRecord(1.0, 1000, 101, 1, 0, 0, 500, 200, first_token=2.0, finish=6.0),
        # dropped by the engine: no tokens, never within SLO
        RequestRecord(1.0, 10**6, 5, 0, 1, 1),
    ]
    row = summarize(RunResult(recs, [[10.0, 30.0]], 30.0), slo, "x", 1.0, 0.0)
    span = 6.0  # first arrival 0 to last finish 6
    assert row["tps"] == pytest.approx(3 * 1101 / span)
    assert row["tps_within_slo"] == pytest.approx(1101 / span)
    assert row["ttft_p50"] == pytest.approx(1.5)
    assert row["local_hit_ratio"] == pytest.approx(500 / (3000 + 10**6))
    assert row["global_hit_ratio"] == pytest.approx(200 / (3000 + 10**6))
    assert row["imbalance_mean"] == pytest.approx(1.5)
    assert row["followup_stickiness"] == 1.0


def test_imbalance_leaves_out_the_drain_after_the_last_arrival() -> None:
    recs = [RequestRecord(40.0, 100, 10, 0, 0, 0, 0, 0, first_token=41.0, finish=200.0)]
    # windows of 30 s: the last arrival (40 s) is in window 1; windows 2-3 are the drain
    windows = [[10.0, 30.0], [20.0, 20.0], [0.0, 50.0], [0.0, 10.0]]
    row = summarize(RunResult(recs, windows, 30.0), Slo(), "x", 1.0, 0.0)
    assert row["imbalance_mean"] == pytest.approx((1.5 + 1.0) / 2)


def _write(path: Path, trace: list[TraceRequest]) -> None:
    with path.open("w") as f:
        for r in trace:
            f.write(
                json.dumps(
                    {
                        "chat_id": r.req_id,
                        "parent_chat_id": r.parent or -1,
                        "timestamp": r.arrival_s,
                        "input_length": r.input_len,
                        "output_length": r.output_len,
                        "type": "text",
                        "turn": r.turn + 1,
                        "hash_ids": list(r.block_ids),
                    }
                )
                + "\n"
            )


def test_cli_same_seed_same_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    _write(trace, _sessions(5, 3, gap_s=2.0))
    outs = []
    for k in range(2):
        out = tmp_path / f"o{k}.json"
        args = ["--trace", str(trace), "--instances", "3", "--policies", "random,smetric"]
        assert main([*args, "--rate-scale", "1,4", "--seed", "7", "--json", str(out)]) == 0
        outs.append(out.read_text())
    assert outs[0] == outs[1]
    doc = json.loads(outs[0])
    assert len(doc["results"]) == 4 and set(doc["max_tps_within_slo"]) == {"random", "smetric"}
    assert doc["results"][0]["global_ratio"] == "inf"
    assert "max TPS within SLO" in capsys.readouterr().out


def test_cli_malformed_trace_names_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    _write(trace, _sessions(1, 2))
    with trace.open("a") as f:
        f.write('{"chat_id": 9, "timestamp": "soon"}\n')
    assert main(["--trace", str(trace), "--format", "bailian"]) == 2
    assert f"{trace}:3" in capsys.readouterr().err


def test_cli_rejects_unknown_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--trace", "x", "--policies", "nope"]) == 2
    assert "unknown policy" in capsys.readouterr().err


def test_session_hints_carry_the_trace_session_only_when_asked() -> None:
    trace = _sessions(1, 2)
    for req in trace:
        assert router_features(req, [], BS).session_hint is None
        assert router_features(req, [], BS, session_hint=True).session_hint == "s0"
    # a run with hints: each session's first turn goes to its home among the idle instances
    # (smetric-inflight: first turns to the least loaded; the default takes the template's holder)
    cfg = replace(SMALL, session_hints=True)
    trace = [replace(r, arrival_s=r.arrival_s * 100) for r in _sessions(6, 1)]  # one at a time
    cluster = Cluster(cfg, make_policy("smetric-inflight"), math.inf)
    res = cluster.run(trace)
    homes = [max(cluster.urls, key=lambda u: rank(req.session, u)) for req in trace]
    assert [cluster.urls[r.instance] for r in res.records] == homes
    assert len(set(homes)) > 1


class _UnprefilledSpy:
    """round_robin, checking per decision that each view's unprefilled is the new tokens (prompt -
    the hit its view showed) of the requests routed there whose first token has not come back."""

    name = "unprefilled-spy"
    uses_text_tree = False

    def __init__(self) -> None:
        self.inner = make_policy("round_robin")
        self.cluster: Cluster | None = None
        self.routed: list[tuple[str, int]] = []  # per decision: (worker, its new tokens there)
        self.hits = 0  # decisions whose chosen worker held part of the prompt
        self.nonzero = 0

    def needs_l3(self, features: RequestFeatures, view: ClusterView) -> bool:
        return False

    def decide(self, features: RequestFeatures, view: ClusterView) -> Decision:
        assert self.cluster is not None
        records = self.cluster._records
        waiting = {v.url: 0 for v in view.workers}
        for n, (url, new) in enumerate(self.routed):
            if records[n].first_token < 0:
                waiting[url] += new
        assert {v.url: v.unprefilled for v in view.workers} == waiting
        self.nonzero += sum(1 for v in view.workers if v.unprefilled > 0)
        d = self.inner.decide(features, view)
        chosen = view.worker(d.worker)
        assert chosen is not None
        self.routed.append((d.worker, features.prompt_len - chosen.hit))
        self.hits += chosen.hit > 0
        return d


def test_the_views_unprefilled_is_the_new_tokens_still_waiting_for_a_first_token() -> None:
    spy = _UnprefilledSpy()
    spy.cluster = Cluster(replace(SMALL, instances=2), spy, math.inf)
    spy.cluster.run(_sessions(6, 3, gap_s=0.05))
    assert spy.nonzero > 0  # turns arrive while others wait for their prefill
    assert spy.hits > 0  # and some counted less than their prompt
