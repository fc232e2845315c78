"""smetric-ftcost: first turns by the cost of prefilling them, follow-ups as smetric (built
views). The tests whose views keep every worker inside smetric-ftband's band run for it too."""

from __future__ import annotations

from dataclasses import replace

import pytest

from smetric_router.policies import make_policy
from tests.policies.builders import assert_follow_ups_match, cluster, req, w

FTCOST = make_policy("smetric-ftcost")
SMETRIC = make_policy("smetric-inflight")
LMETRIC_INFLIGHT = make_policy("lmetric-inflight")


@pytest.mark.parametrize("name", ["smetric-ftcost", "smetric-ftband"])
def test_first_turn_goes_to_a_templates_holder_while_its_queue_costs_less_than_the_prefix(
    name: str,
) -> None:
    policy = make_policy(name)
    # w0 holds 6,000 of the 8,000-token prompt and has one request in flight: 2,000 x 2 = 4,000
    # against w1's 8,000 x 1 (and inside smetric-ftband's band, 1 + 1 <= 2 x (0 + 1))
    view = cluster(w(load=1, hit=6_000), w(load=0))
    d = policy.decide(req(prompt_len=8_000, turn=0), view)
    assert (d.worker, d.reason) == ("w0", "first-turn-balance")
    assert SMETRIC.decide(req(prompt_len=8_000, turn=0), view).worker == "w1"
    # three in flight: 2,000 x 4 = 8,000 ties w1's 8,000, and the tie goes to the fewest in flight
    view = cluster(w(load=3, hit=6_000), w(load=0))
    assert policy.decide(req(prompt_len=8_000, turn=0), view).worker == "w1"


@pytest.mark.parametrize("name", ["smetric-ftcost", "smetric-ftband"])
def test_first_turn_ties_go_to_the_fewest_in_flight_then_round_robin(name: str) -> None:
    policy = make_policy(name)  # the band holds every worker in these views
    # 500 x 2 = 1,000 x 1 for all three: the fewest in flight
    even = cluster(w(load=1, hit=500), w(load=0), w(load=1, hit=500))
    chosen = [policy.decide(req(prompt_len=1_000, turn=0), replace(even, tick=t)).worker
              for t in range(4)]  # fmt: skip
    assert chosen == ["w1"] * 4
    # 1,000 each at one in flight each, w2 3,000: round-robin between w0 and w1
    level = cluster(w(load=1, hit=500), w(load=1, hit=500), w(load=2))
    chosen = [policy.decide(req(prompt_len=1_000, turn=0), replace(level, tick=t)).worker
              for t in range(4)]  # fmt: skip
    assert chosen == ["w0", "w1", "w0", "w1"]


def test_the_first_turn_is_lmetric_inflights_choice_when_that_one_is_unique() -> None:
    views = [
        cluster(w(load=1, hit=6_000), w(load=0), w(load=4, hit=7_900)),
        cluster(w(load=0, hit=100), w(load=2, hit=5_000), w(load=1)),
        cluster(w(load=5, hit=7_200), w(load=0, hit=2_000)),
    ]
    for view in views:
        first = req(prompt_len=8_000, turn=0)
        assert FTCOST.decide(first, view).worker == LMETRIC_INFLIGHT.decide(first, view).worker


@pytest.mark.parametrize("name", ["smetric-ftcost", "smetric-ftband"])
def test_first_turn_skips_a_worker_whose_circuit_is_open(name: str) -> None:
    view = cluster(replace(w(load=0, hit=900), breaker_open=True), w(load=0), w(load=1))
    assert make_policy(name).decide(req(prompt_len=1_000, turn=0), view).worker == "w1"


@pytest.mark.parametrize("name", ["smetric-ftcost", "smetric-ftband"])
def test_follow_ups_are_smetrics(name: str) -> None:
    views = [
        cluster(w(load=2, hit=100), w(load=3, hit=800)),
        cluster(w(load=10, hit=800), w(load=0, hit=700), w(load=1)),
        cluster(w(load=0, hit=100), w(load=5, hit=820)),
    ]
    assert_follow_ups_match(make_policy(name), SMETRIC, views)
