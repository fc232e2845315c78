"""smetric-delay: smetric's cost plus the prefill queued on the worker, for first turns and for
the guards (built views)."""

from __future__ import annotations

from dataclasses import replace

from smetric_router.policies import make_policy
from tests.policies.builders import assert_follow_ups_match, cluster, req, w

DELAY = make_policy("smetric-delay")
SMETRIC = make_policy("smetric-inflight")


def test_a_first_turn_goes_where_least_prefill_waits_before_it_and_on_it() -> None:
    # one request in flight on each: w0's is still prefilling 30,000 tokens, w1's decoding
    view = cluster(w(load=1, unprefilled=30_000), w(load=1))
    d = DELAY.decide(req(prompt_len=8_000, turn=0), view)
    assert (d.worker, d.reason) == ("w1", "first-turn-balance")
    # a request count cannot tell them apart: smetric round-robins
    assert {SMETRIC.decide(req(prompt_len=8_000, turn=0), replace(view, tick=t)).worker
            for t in range(2)} == {"w0", "w1"}  # fmt: skip


def test_a_first_turn_weighs_a_templates_holder_against_the_queue_there() -> None:
    # w0 holds 6,000 of the 8,000 tokens: 2,000 x (1 + 1) + 3,000 queued = 7,000 < 8,000 on w1
    view = cluster(w(load=1, hit=6_000, unprefilled=3_000), w(load=0))
    assert DELAY.decide(req(prompt_len=8_000, turn=0), view).worker == "w0"
    # 5,000 queued there: 9,000 > 8,000
    view = cluster(w(load=1, hit=6_000, unprefilled=5_000), w(load=0))
    assert DELAY.decide(req(prompt_len=8_000, turn=0), view).worker == "w1"


def test_first_turn_ties_go_to_the_fewest_in_flight_then_round_robin() -> None:
    even = cluster(
        w(load=2, unprefilled=0), w(load=0, unprefilled=2_000), w(load=1, unprefilled=1_000)
    )
    # 1,000 x 3 = 3,000; 2,000 + 1,000 = 3,000; 1,000 + 2,000 = 3,000: the fewest in flight
    chosen = {DELAY.decide(req(prompt_len=1_000, turn=0), replace(even, tick=t)).worker
              for t in range(3)}  # fmt: skip
    assert chosen == {"w1"}
    level = cluster(w(load=1), w(load=1))
    chosen_list = [DELAY.decide(req(prompt_len=1_000, turn=0), replace(level, tick=t)).worker
                   for t in range(4)]  # fmt: skip
    assert chosen_list == ["w0", "w1", "w0", "w1"]


def test_a_follow_up_leaves_a_holder_whose_queued_prefill_outweighs_twice_a_move() -> None:
    # holder w0: 100 new tokens x 2 + 20,000 queued = 20,200 against w1's 900 x 1 (x 2 = 1,800)
    view = cluster(w(load=1, hit=800, unprefilled=20_000), w(load=0))
    f = req(prompt_len=900, turn=1, est_hit=800)
    d = DELAY.decide(f, view)
    assert (d.worker, d.reason) == ("w1", "overload-fallback")
    # smetric sees one request in flight: 200 against 2 x 900, and stays
    assert SMETRIC.decide(f, view).reason == "sticky"
    # with 1,000 queued the holder costs 1,200 <= 1,800: sticky
    view = cluster(w(load=1, hit=800, unprefilled=1_000), w(load=0))
    assert DELAY.decide(f, view) == SMETRIC.decide(f, view)
    assert DELAY.decide(f, view).reason == "sticky"


def test_with_nothing_queued_anywhere_first_turns_are_smetric_ftcosts() -> None:
    ftcost = make_policy("smetric-ftcost")
    views = [
        cluster(w(load=1, hit=6_000), w(load=0), w(load=4, hit=7_900)),
        cluster(w(load=0, hit=100), w(load=2, hit=5_000), w(load=1)),
        cluster(w(load=1, hit=500), w(load=1, hit=500), w(load=2)),
    ]
    for view in views:
        for tick in range(3):
            first = req(prompt_len=8_000, turn=0)
            assert DELAY.decide(first, replace(view, tick=tick)) == ftcost.decide(
                first, replace(view, tick=tick)
            )


def test_with_nothing_queued_anywhere_follow_ups_are_smetrics() -> None:
    views = [
        cluster(w(load=2, hit=100), w(load=3, hit=800)),
        cluster(w(load=10, hit=800), w(load=0, hit=700), w(load=1)),
        cluster(w(load=0, hit=100), w(load=5, hit=820)),
    ]
    assert_follow_ups_match(DELAY, SMETRIC, views)


def test_an_evicted_history_falls_back_to_the_least_delay() -> None:
    # nobody holds more than half of the 800-token history: the fallback takes the least cost,
    # which the queued prefill on w1 decides
    view = cluster(w(load=0, hit=100, unprefilled=5_000), w(load=1, hit=100))
    d = DELAY.decide(req(prompt_len=900, turn=1, est_hit=800), view)
    assert (d.worker, d.reason) == ("w1", "evicted-fallback")
