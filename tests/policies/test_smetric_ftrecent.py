"""smetric-ftrecent: first turns by the tokens sent lately, follow-ups as smetric (built views)."""

from __future__ import annotations

from dataclasses import replace

from smetric_router.policies import make_policy
from tests.policies.builders import assert_follow_ups_match, cluster, req, w

FTRECENT = make_policy("smetric-ftrecent")
SMETRIC = make_policy("smetric-inflight")


def test_first_turn_goes_where_the_least_was_sent_lately_not_to_the_least_loaded() -> None:
    # w0 was given two long sessions, now between turns (nothing in flight); w1 one short one
    # that is mid-request
    view = cluster(w(load=0, recent=60_000), w(load=1, recent=9_000))
    d = FTRECENT.decide(req(turn=0), view)
    assert (d.worker, d.reason) == ("w1", "first-turn-balance")
    assert SMETRIC.decide(req(turn=0), view).worker == "w0"


def test_first_turn_ties_go_to_the_fewest_in_flight_then_round_robin() -> None:
    view = cluster(w(load=2), w(load=1), w(load=1), w(load=0, recent=5))
    chosen = [FTRECENT.decide(req(turn=0), replace(view, tick=t)).worker for t in range(4)]
    assert chosen == ["w1", "w2", "w1", "w2"]


def test_first_turn_skips_a_worker_whose_circuit_is_open() -> None:
    view = cluster(w(recent=10), w(recent=0), w(recent=5))
    view = replace(view, workers=(view.workers[0], replace(view.workers[1], breaker_open=True),
                                  view.workers[2]))  # fmt: skip
    assert FTRECENT.decide(req(turn=0), view).worker == "w2"


def test_a_session_hint_picks_among_the_least_sent_only() -> None:
    view = cluster(w(recent=10), w(recent=0), w(recent=0))
    hinted = replace(req(turn=0), session_hint="agent-7")
    chosen = {FTRECENT.decide(hinted, replace(view, tick=t)).worker for t in range(8)}
    assert len(chosen) == 1 and chosen <= {"w1", "w2"}


def test_follow_ups_are_smetrics() -> None:
    views = [
        cluster(w(load=2, recent=900), w(load=3, hit=800, recent=40_000)),
        cluster(w(load=10, hit=800), w(load=0, recent=1e6), w(load=1)),
        cluster(w(load=0, hit=100, recent=5), w(load=5, unprefilled=10)),
    ]
    assert_follow_ups_match(FTRECENT, SMETRIC, views)
