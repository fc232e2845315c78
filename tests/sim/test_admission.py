"""SimConfig.max_concurrent_requests: the router's admission cap in the simulator, with the
router's own queue order (follow-ups first, first turns past the ceiling before them) and its
kept session slots (queue_session_grace_s) and its queue timeout (queue_timeout_s)."""

from __future__ import annotations

import itertools
import math
from dataclasses import fields, replace

import pytest

from smetric_router.policies import make_policy
from smetric_router.router.config import RouterConfig
from smetric_router.sim.__main__ import main as sim_main
from smetric_router.sim.cluster import Cluster, RequestRecord, RunResult
from smetric_router.sim.config import SimConfig
from smetric_router.sim.metrics import summarize
from smetric_router.traces.schema import TraceRequest
from tests.sim.test_sim import _sessions

TWO = SimConfig(instances=2, gpu_kv_tokens=1 << 16, host_kv_tokens=0)


def _queue() -> list[TraceRequest]:
    """A first turn, then a new session's first turn and another session's follow-up (its parent
    replayed before the window), 1 ms apart: with a cap of 1 the last two wait at the router."""
    trace = {r.req_id: r for r in _sessions(3, 2, gap_s=60.0)}
    return [
        replace(trace["s0t0"], arrival_s=0.0),
        replace(trace["s1t0"], arrival_s=0.001),
        replace(trace["s2t1"], arrival_s=0.002),
    ]


def _run(trace: list[TraceRequest], cfg: SimConfig = TWO) -> tuple[dict[str, float], RunResult]:
    res = Cluster(cfg, make_policy("round_robin"), math.inf).run(trace)
    return {trace[r.trace_index].req_id: r.first_token for r in res.records}, res


def test_without_a_cap_every_request_is_placed_when_it_arrives() -> None:
    ft, res = _run(_queue())
    assert ft["s2t1"] < ft["s0t0"] + 0.5  # on the other instance, not after s0t0's reply
    assert res.longest_router_wait_s == 0.0


def test_the_cap_holds_requests_at_the_router_until_one_ends() -> None:
    _, res = _run(_queue(), replace(TWO, max_concurrent_requests=1))
    by_id = {_queue()[r.trace_index].req_id: r for r in res.records}
    first, second = by_id["s0t0"], by_id["s2t1"]
    assert second.first_token > first.finish  # placed only when s0t0 ended
    assert second.arrival == pytest.approx(0.002)  # its TTFT counts its wait at the router
    assert res.longest_router_wait_s >= first.finish - 0.002
    assert second.router_wait == pytest.approx(first.finish - 0.002)  # placed as s0t0 ended
    assert first.router_wait == 0.0
    assert max(r.router_wait for r in res.records) == pytest.approx(res.longest_router_wait_s)
    assert len(res.records) == 3


def test_follow_ups_are_admitted_before_first_turns_that_came_earlier() -> None:
    ft, _ = _run(_queue(), replace(TWO, max_concurrent_requests=1))
    assert ft["s0t0"] < ft["s2t1"] < ft["s1t0"]


def test_a_first_turn_past_the_ceiling_goes_before_follow_ups() -> None:
    ft, _ = _run(_queue(), replace(TWO, max_concurrent_requests=1, queue_first_turn_ceiling_s=0.0))
    assert ft["s0t0"] < ft["s1t0"] < ft["s2t1"]


def test_follow_ups_sent_on_the_reply_go_through_the_cap_too() -> None:
    trace = _sessions(4, 3, gap_s=60.0)
    for mode in ("trace", "on-reply"):
        _, free = _run(trace, replace(TWO, follow_ups=mode))
        _, capped = _run(trace, replace(TWO, follow_ups=mode, max_concurrent_requests=1))
        assert len(capped.records) == len(free.records) == len(trace)
        spans = sorted((r.first_token, r.finish) for r in capped.records)
        # one in flight at a time: each request's first token after the previous one's reply
        assert all(b[0] >= a[1] for a, b in itertools.pairwise(spans))


ON_REPLY = replace(TWO, follow_ups="on-reply", max_concurrent_requests=1)


def _two_sessions() -> list[TraceRequest]:
    """Two sessions of two turns; the second session's first turn queues behind the first's."""
    trace = {r.req_id: r for r in _sessions(2, 2, gap_s=60.0)}
    return [
        replace(trace["s0t0"], arrival_s=0.0),
        replace(trace["s1t0"], arrival_s=0.001),
        trace["s0t1"],
        trace["s1t1"],
    ]


def test_the_plain_cap_gives_a_freed_slot_to_the_queue() -> None:
    ft, res = _run(_two_sessions(), ON_REPLY)
    assert ft["s0t0"] < ft["s1t0"] < ft["s0t1"]
    assert res.kept_slot_claims == 0


def test_a_kept_slot_goes_to_the_sessions_next_turn_first() -> None:
    trace = _two_sessions()
    ft, res = _run(trace, replace(ON_REPLY, queue_session_grace_s=1.0))
    assert ft["s0t0"] < ft["s0t1"] < ft["s1t0"] < ft["s1t1"]
    assert res.kept_slot_claims == 2  # s0t1 and s1t1 each took the slot its session left
    # s1t0 waited for s0t1's slot, which nobody claimed, to come back after the grace
    s0t1 = next(r for r in res.records if trace[r.trace_index].req_id == "s0t1")
    assert ft["s1t0"] >= s0t1.finish + 1.0
    assert res.longest_router_wait_s >= s0t1.finish + 1.0 - 0.001


def _by_id(trace: list[TraceRequest], res: RunResult) -> dict[str, RequestRecord]:
    return {trace[r.trace_index].req_id: r for r in res.records}


@pytest.mark.parametrize("mode", ["on-reply", "trace"])
def test_a_request_past_the_queue_timeout_is_refused_and_its_conversation_goes_on(
    mode: str,
) -> None:
    trace = _two_sessions()
    cfg = replace(ON_REPLY, follow_ups=mode)
    _, free = _run(trace, replace(cfg, queue_timeout_s=math.inf))
    busy = _by_id(trace, free)["s0t0"].finish  # s1t0 waits this long behind it without a timeout
    timeout = busy / 2
    _, res = _run(trace, replace(cfg, queue_timeout_s=timeout))
    got = _by_id(trace, res)
    refused = got["s1t0"]
    assert refused.refused and refused.instance == -1
    assert refused.first_token == refused.finish == -1.0  # never placed, never served
    assert refused.router_wait == pytest.approx(timeout)
    assert len(res.records) == len(trace)  # every turn was still sent
    at = refused.arrival + timeout
    # on the reply, the client sends the next turn when the failed one comes back; from the
    # trace, at its own time
    assert got["s1t1"].arrival == pytest.approx(at if mode == "on-reply" else trace[3].arrival_s)
    assert not got["s0t0"].refused and got["s0t0"].router_wait == 0.0
    row = summarize(res, cfg.slo, "round_robin", 1.0, math.inf)
    assert row["refused"] == sum(r.refused for r in res.records) >= 1
    # the refused request counts toward no tier's hits and no session's stickiness
    placed = [r for r in res.records if not r.refused]
    assert row["reuse_ratio"] == pytest.approx(
        sum(r.cached_local + r.cached_global for r in placed) / sum(r.input_len for r in placed)
    )


def test_without_a_timeout_a_request_waits_until_admitted() -> None:
    trace = _two_sessions()
    _, res = _run(trace, replace(ON_REPLY, queue_timeout_s=math.inf))
    assert not any(r.refused for r in res.records)
    assert all(r.first_token >= 0 for r in res.records)


def test_the_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="queue_timeout_s"):
        replace(TWO, queue_timeout_s=0.0)


def test_kept_slots_need_the_cap() -> None:
    with pytest.raises(ValueError, match="max_concurrent_requests"):
        replace(TWO, queue_session_grace_s=1.0)


def test_a_negative_cap_is_refused() -> None:
    with pytest.raises(ValueError, match="max_concurrent_requests"):
        SimConfig(max_concurrent_requests=-1)


def test_the_cli_refuses_the_cap_under_pd(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_main(["--pd", "--max-concurrent-requests", "8", "--trace", "unused.jsonl"]) == 2
    assert "--max-concurrent-requests is not modelled under --pd" in capsys.readouterr().err


def test_the_timeout_defaults_to_the_routers() -> None:
    router = next(f.default for f in fields(RouterConfig) if f.name == "queue_timeout_secs")
    assert SimConfig().queue_timeout_s == router


def test_a_kept_slot_that_comes_back_before_the_timeout_admits_the_waiting_request() -> None:
    trace = _two_sessions()
    kept = replace(ON_REPLY, queue_session_grace_s=1.0)
    _, res = _run(trace, replace(kept, queue_timeout_s=math.inf))
    wait = _by_id(trace, res)["s1t0"].router_wait  # it waits for s0t1's unclaimed slot
    assert wait > 1.0
    _, res = _run(trace, replace(kept, queue_timeout_s=wait + 0.01))
    assert not _by_id(trace, res)["s1t0"].refused
    assert _by_id(trace, res)["s1t0"].router_wait == pytest.approx(wait)
    _, res = _run(trace, replace(kept, queue_timeout_s=wait - 0.01))
    assert _by_id(trace, res)["s1t0"].refused


def test_a_request_admitted_before_its_timeout_leaves_the_clock_running() -> None:
    """The timeout of the oldest waiting request is a point the simulation runs to; when that
    request was admitted on the way, the replies after it still come before a later arrival."""
    trace = {r.req_id: r for r in _sessions(3, 2, gap_s=60.0)}
    reqs = [
        replace(trace["s0t0"], arrival_s=0.0),
        replace(trace["s1t0"], arrival_s=0.001),  # waits behind s0t0 and is admitted when it ends
        replace(trace["s2t1"], arrival_s=30.0),  # comes when both have ended
    ]
    cfg = replace(TWO, max_concurrent_requests=1)
    _, free = _run(reqs, replace(cfg, queue_timeout_s=math.inf))
    done = _by_id(reqs, free)
    assert done["s1t0"].finish < 30.0
    # s1t0 is admitted before its timeout and still runs when that time comes
    timeout = (done["s0t0"].finish + done["s1t0"].finish) / 2
    _, res = _run(reqs, replace(cfg, queue_timeout_s=timeout))
    got = _by_id(reqs, res)
    assert not any(r.refused for r in res.records)
    assert got["s2t1"].router_wait == 0.0  # s1t0's reply was seen before s2t1 arrived
    assert got["s1t0"].router_wait == pytest.approx(done["s1t0"].router_wait)
