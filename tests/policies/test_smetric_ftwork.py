"""smetric-ftwork: first turns by unprefilled tokens, follow-ups as smetric, on built views."""

from __future__ import annotations

from dataclasses import replace

from smetric_router.policies import make_policy
from tests.policies.builders import assert_follow_ups_match, cluster, req, w

FTWORK = make_policy("smetric-ftwork")
SMETRIC = make_policy("smetric-inflight")


def test_first_turn_goes_to_the_least_unprefilled_worker_not_the_least_loaded() -> None:
    # w0: 3 requests decoding, nothing left to prefill; w1: one 30K-token prompt still queued.
    view = cluster(w(load=3, unprefilled=0), w(load=1, unprefilled=30_000))
    d = FTWORK.decide(req(turn=0), view)
    assert (d.worker, d.reason) == ("w0", "first-turn-balance")
    assert SMETRIC.decide(req(turn=0), view).worker == "w1"


def test_first_turn_ties_go_to_the_fewest_in_flight_then_round_robin() -> None:
    view = cluster(w(load=2), w(load=1), w(load=1), w(load=1, unprefilled=5))
    chosen = [FTWORK.decide(req(turn=0), replace(view, tick=t)).worker for t in range(4)]
    assert chosen == ["w1", "w2", "w1", "w2"]


def test_first_turn_ignores_a_cached_template() -> None:
    view = cluster(w(unprefilled=100, hit=900), w(unprefilled=99))
    assert FTWORK.decide(req(turn=0), view).worker == "w1"


def test_a_session_hint_picks_among_the_least_unprefilled_only() -> None:
    view = cluster(w(unprefilled=10), w(unprefilled=0), w(unprefilled=0))
    hinted = replace(req(turn=0), session_hint="agent-7")
    assert all(
        FTWORK.decide(hinted, replace(view, tick=t)).worker in ("w1", "w2") for t in range(8)
    )
    assert len({FTWORK.decide(hinted, replace(view, tick=t)).worker for t in range(8)}) == 1


def test_follow_ups_are_smetrics() -> None:
    views = [
        cluster(w(load=2, unprefilled=900), w(load=3, hit=800, unprefilled=4000)),
        cluster(w(load=10, hit=800), w(load=0), w(load=1)),
        cluster(w(load=0, hit=100), w(load=5, unprefilled=10)),
    ]
    assert_follow_ups_match(FTWORK, SMETRIC, views)
