"""`smetric-paper`: the paper's Figure 13 line by line, with none of the default's additions."""

from __future__ import annotations

from dataclasses import replace

from smetric_router.policies import PolicyParams, make_policy
from tests.policies.builders import cluster, req, w

PAPER = make_policy("smetric-paper")


def test_first_turn_to_least_load_follow_up_to_best_hit() -> None:
    view = cluster(w(load=3, hit=900), w(load=1, hit=0), w(load=2, hit=160))
    assert PAPER.decide(req(turn=0), view).worker == "w1"
    d = PAPER.decide(req(turn=2, est_hit=950), view)
    assert (d.worker, d.reason) == ("w0", "sticky")


def test_overload_is_the_bare_ratio_with_no_slack() -> None:
    # mean 0.75: 2 x mean = 1.5 < 2, where the default's cost guard keeps it sticky
    view = cluster(w(load=2, hit=800), w(load=1), w(), w())
    d = PAPER.decide(req(turn=1, est_hit=800), view)
    assert (d.worker, d.reason) == ("w2", "overload-fallback")
    assert make_policy("smetric").decide(req(turn=1, est_hit=800), view).reason == "sticky"
    at_bound = cluster(w(load=4, hit=800), w(load=2), w(load=1), w(load=1))  # 4 <= 2 x 2
    assert PAPER.decide(req(turn=1, est_hit=800), at_bound).reason == "sticky"


def test_evicted_when_the_best_hit_is_not_above_hit_ratio_of_est_hit() -> None:
    view = cluster(w(load=1, hit=400), w(load=0))
    d = PAPER.decide(req(turn=3, est_hit=800), view)  # 400 is not > 0.5 x 800
    assert (d.worker, d.reason) == ("w1", "evicted-fallback")
    assert PAPER.decide(req(turn=3, est_hit=790), view).reason == "sticky"
    # with no countable history, a follow-up sticks only to a worker with some hit (c[s] > 0)
    assert PAPER.decide(req(turn=1, est_hit=0), cluster(w(load=1), w())).reason == (
        "evicted-fallback"
    )


def test_no_l3_view_and_no_session_hint() -> None:
    aware = make_policy("smetric-paper", PolicyParams(l3_aware=True))
    view = cluster(w(load=1, hit=100, l3=800), w(load=0))
    assert aware.decide(req(turn=1, est_hit=800), view).reason == "evicted-fallback"
    hinted = replace(req(turn=0), session_hint="s1")
    ties = [PAPER.decide(hinted, cluster(w(), w(), tick=t)).worker for t in range(4)]
    assert ties == ["w0", "w1", "w0", "w1"]  # round robin, the hint unread
