from __future__ import annotations

import pytest

from smetric_router.policies import PolicyParams, make_policy, policy_names
from tests.policies.builders import cluster, req, w


def test_registry_lists_every_policy_and_rejects_unknown_names() -> None:
    assert set(policy_names()) == {
        "smetric",
        "smetric-paper",
        "smetric-ftwork",
        "smetric-ftrecent",
        "smetric-ftcost",
        "smetric-ftband",
        "smetric-delay",
        "smetric-inflight",
        "smetric-l3move",
        "smetric-fetch",
        "bailian",
        "lmetric",
        "lmetric-inflight",
        "load_balance",
        "least_tokens",
        "cache_aware",
        "round_robin",
        "random",
        "power_of_two",
    }
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        make_policy("nope")


def test_invalid_params_are_rejected() -> None:
    with pytest.raises(ValueError, match="hit_ratio"):
        PolicyParams(hit_ratio=1.5)


def test_load_balance_ignores_hits() -> None:
    d = make_policy("load_balance").decide(req(turn=3, est_hit=900), cluster(w(3, 900), w(1, 0)))
    assert (d.worker, d.reason) == ("w1", "load_balance")


def test_bailian_prefers_hit_unless_load_dominates() -> None:
    bailian = make_policy("bailian", PolicyParams(bailian_lambda=0.9))
    # lambda 0.9: w0 score 0.1*1 + 0.9*0.1 = 0.19; w1 score 0 + 0.9*1 = 0.9
    assert bailian.decide(req(1000), cluster(w(4, 900), w(0, 0))).worker == "w0"
    load_heavy = make_policy("bailian", PolicyParams(bailian_lambda=0.05))
    assert load_heavy.decide(req(1000), cluster(w(4, 900), w(0, 0))).worker == "w1"


def test_lmetric_inflight_scores_uncached_tokens_times_inflight_plus_one() -> None:
    lm = make_policy("lmetric-inflight")
    # w0: (1000-900)*(4+1)=500 ; w1: 1000*(0+1) = 1000
    assert lm.decide(req(1000), cluster(w(4, 900), w(0, 0))).worker == "w0"
    # w0: 100*(12+1)=1300 > 1000
    assert lm.decide(req(1000), cluster(w(12, 900), w(0, 0))).worker == "w1"
    # the reported running batch plays no part: the in-flight count (queue included) does
    view = cluster(w(4, 900, running=0), w(0, 0, running=9))
    d = lm.decide(req(1000), view)
    assert (d.worker, d.reason) == ("w0", "lmetric-inflight")


def test_lmetric_prefers_an_idle_instance_over_a_busy_one_with_a_better_hit() -> None:
    lm = make_policy("lmetric")
    # w0: (1000-900)*4 = 400 ; w1: 1000*0 = 0: the plain product, as the paper defines it
    d = lm.decide(req(1000), cluster(w(4, 900, running=4), w(0, 0, running=0)))
    assert (d.worker, d.reason) == ("w1", "lmetric")
    # idle instances tie at 0 whatever their hits and are taken round-robin by the view's tick
    picks = [
        lm.decide(req(1000), cluster(w(0, 900, running=0), w(0, 0, running=0), tick=t)).worker
        for t in range(2)
    ]
    assert sorted(picks) == ["w0", "w1"]


def test_lmetric_counts_the_running_batch_not_the_queue() -> None:
    lm = make_policy("lmetric")
    # w0 has 20 in flight but only 2 running (18 queued): 100*2 = 200 < w1's 1000*1
    assert lm.decide(req(1000), cluster(w(20, 900, running=2), w(1, 0, running=1))).worker == "w0"
    # with 12 running its score 1200 loses, whatever the in-flight counts say
    assert lm.decide(req(1000), cluster(w(12, 900, running=12), w(30, 0, running=1))).worker == "w1"


def test_lmetric_falls_back_to_the_inflight_count_when_running_is_unknown() -> None:
    lm = make_policy("lmetric")
    # w0 unknown: 100*4 = 400 (in flight, no + 1) < w1's 1000*1
    assert lm.decide(req(1000), cluster(w(4, 900), w(9, 0, running=1))).worker == "w0"
    # w0 unknown: 100*12 = 1200 > 1000
    assert lm.decide(req(1000), cluster(w(12, 900), w(0, 0, running=1))).worker == "w1"
    # a hit beyond the prompt scores 0, not below: it ties with the idle instance
    tied = {lm.decide(req(1000), cluster(w(3, 2000), w(5, 0, running=0), tick=t)).worker
            for t in range(2)}  # fmt: skip
    assert tied == {"w0", "w1"}


def test_cache_aware_follows_text_match_when_balanced() -> None:
    ca = make_policy("cache_aware")
    text = "x" * 100
    view = cluster(w(1, text_match=10, tree=5), w(2, text_match=80, tree=900))
    assert ca.decide(req(text=text), view).worker == "w1"


def test_cache_aware_picks_smallest_tree_below_threshold() -> None:
    ca = make_policy("cache_aware")
    view = cluster(w(1, text_match=20, tree=900), w(2, text_match=10, tree=5))
    assert ca.decide(req(text="x" * 100), view).worker == "w1"


def test_cache_aware_shortest_queue_when_imbalanced() -> None:
    ca = make_policy("cache_aware")
    view = cluster(w(200, text_match=100, tree=5), w(10, text_match=0, tree=900))
    assert ca.decide(req(text="x" * 100), view).worker == "w1"


def test_round_robin_cycles_over_healthy_workers() -> None:
    rr = make_policy("round_robin")
    seq = [rr.decide(req(), cluster(w(), w(healthy=False), w(), tick=t)).worker for t in range(4)]
    assert seq == ["w0", "w2", "w0", "w2"]


def test_random_and_power_of_two_use_view_entropy() -> None:
    rnd, p2 = make_policy("random"), make_policy("power_of_two")
    picks = {rnd.decide(req(), cluster(w(), w(), w(), entropy=e)).worker for e in range(30)}
    assert picks == {"w0", "w1", "w2"}
    for e in range(30):
        view = cluster(w(5), w(1), w(9), entropy=e)
        i = e % 3
        j = (i + 1 + (e // 3) % 2) % 3
        loads = [5, 1, 9]
        expect = f"w{j}" if loads[j] < loads[i] else f"w{i}"
        assert p2.decide(req(), view).worker == expect
