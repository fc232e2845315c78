"""smetric (the default) and smetric-l3move, its other name: smetric-delay, but a follow-up whose
history the global tier holds goes where its delay is least (built views)."""

from __future__ import annotations

from dataclasses import replace

from smetric_router.core.types import ClusterView, Decision, RequestFeatures, WorkerView
from smetric_router.policies import make_policy
from smetric_router.policies.smetric_delay import delay_cost
from smetric_router.policies.smetric_l3move import cost
from tests.policies.builders import (
    assert_follow_ups_match,
    cluster,
    random_cases,
    req,
    w,
    with_l3,
)

L3MOVE = make_policy("smetric-l3move")
DELAY = make_policy("smetric-delay")

# an 800-token history and 900 new tokens: 1,700 in all
FOLLOW_UP = req(prompt_len=1_700, turn=1, est_hit=800)


def test_a_follow_up_the_global_tier_holds_leaves_a_busier_holder() -> None:
    # holder w0: 900 new tokens x (1 + 1) = 1,800 against w1's 1,700 x 1; the global tier
    # holds the history, so the move costs a fetch, not a recompute
    view = cluster(w(load=1, hit=800, l3=800), w(load=0, l3=800))
    d = L3MOVE.decide(FOLLOW_UP, view)
    assert (d.worker, d.reason) == ("w1", "l3-move")
    # smetric-delay keeps it: 1,800 is within twice 1,700
    assert DELAY.decide(FOLLOW_UP, view).reason == "sticky"


def test_the_holder_keeps_a_follow_up_while_its_delay_is_least() -> None:
    view = cluster(w(load=0, hit=800, l3=800), w(load=0, l3=800))
    d = L3MOVE.decide(FOLLOW_UP, view)
    assert (d.worker, d.reason) == ("w0", "sticky")
    # the queue on the holder counts: 5,000 queued tokens outweigh the history it holds
    view = cluster(w(load=1, hit=800, unprefilled=5_000, l3=800), w(load=2, l3=800))
    assert L3MOVE.decide(FOLLOW_UP, view).worker == "w1"


def test_ties_go_to_the_higher_local_hit_then_the_fewest_in_flight() -> None:
    # w0: 900 x 2 = 1,800; w1: 1,700 + 100 queued = 1,800; w2: 1,200 x 1 + 600 = 1,800
    view = cluster(
        w(load=1, hit=800, l3=800),
        w(load=0, unprefilled=100, l3=800),
        w(load=0, hit=500, unprefilled=600, l3=800),
    )
    assert L3MOVE.decide(FOLLOW_UP, view).worker == "w0"
    # equal hits: the fewest in flight, then round-robin by the view's tick
    view = cluster(w(load=1, l3=800, unprefilled=0), w(load=0, unprefilled=1_700, l3=800))
    assert L3MOVE.decide(FOLLOW_UP, view).worker == "w1"
    level = cluster(w(load=1, l3=800), w(load=1, l3=800))
    chosen = [L3MOVE.decide(FOLLOW_UP, replace(level, tick=t)).worker for t in range(4)]
    assert chosen == ["w0", "w1", "w0", "w1"]


def test_a_session_hint_breaks_a_tie_for_its_home_alike_on_every_tick() -> None:
    level = cluster(w(load=1, l3=800), w(load=1, l3=800), w(load=1, l3=800))
    hinted = replace(FOLLOW_UP, session_hint="session-7")
    chosen = {L3MOVE.decide(hinted, replace(level, tick=t)).worker for t in range(3)}
    assert len(chosen) == 1


def test_a_history_evicted_locally_but_held_in_the_global_tier_goes_to_the_least_delay() -> None:
    # nobody holds more than 100 of 800 tokens locally: smetric-delay's eviction guard balances
    # it; here the least delay decides, w1 with nothing queued
    view = cluster(w(load=0, hit=100, unprefilled=5_000, l3=800), w(load=1, hit=100, l3=800))
    d = L3MOVE.decide(FOLLOW_UP, view)
    assert d.worker == "w1"
    assert d.worker == DELAY.decide(FOLLOW_UP, view).worker


def _views(l3: int | None) -> list[ClusterView]:
    return [
        cluster(w(load=1, hit=800, l3=l3), w(load=0, l3=l3)),
        cluster(w(load=10, hit=800, l3=l3), w(load=0, hit=700, l3=l3), w(load=1, l3=l3)),
        cluster(w(load=1, hit=800, unprefilled=5_000, l3=l3), w(load=2, l3=l3)),
        cluster(w(load=0, hit=100, l3=l3), w(load=5, hit=820, l3=l3)),
    ]


def test_on_colocated_workers_without_a_global_tier_every_decision_is_smetric_delays() -> None:
    for l3 in (0, None):  # no tier, or its state unknown: never read as holding the history
        views = _views(l3)
        assert_follow_ups_match(L3MOVE, DELAY, views)
        for view in views:
            for f in (FOLLOW_UP, req(prompt_len=1_700, turn=0)):
                assert L3MOVE.decide(f, view) == DELAY.decide(f, view)


def test_a_history_the_tier_holds_too_little_of_keeps_smetric_delays_guard() -> None:
    # 400 of an 800-token history in the tier is not more than HIT_RATIO (0.5) x 800
    view = cluster(w(load=1, hit=800, l3=400), w(load=0, l3=400))
    assert L3MOVE.decide(FOLLOW_UP, view) == DELAY.decide(FOLLOW_UP, view)
    assert L3MOVE.decide(FOLLOW_UP, view).reason == "sticky"


def test_first_turns_are_smetric_delays_even_where_the_tier_holds_their_template() -> None:
    view = cluster(w(load=1, hit=600, l3=600), w(load=0, l3=600), w(load=3, l3=600))
    for tick in range(3):
        first: RequestFeatures = req(prompt_len=1_700, turn=0)
        at = replace(view, tick=tick)
        assert L3MOVE.decide(first, at) == DELAY.decide(first, at)
        assert L3MOVE.decide(first, at).reason == "first-turn-balance"


def test_the_default_smetric_is_this_policy_decision_for_decision() -> None:
    default = make_policy("smetric")
    assert default.name == "smetric"
    for f, view in random_cases(seed=13):
        for l3 in (None, 0, f.est_hit // 2, f.est_hit, f.prompt_len):
            tiered = with_l3(view, l3)
            assert default.decide(f, tiered) == L3MOVE.decide(f, tiered), (f, tiered)
            assert default.needs_l3(f, tiered) == L3MOVE.needs_l3(f, tiered)


def test_on_colocated_workers_the_price_is_smetric_delays_whatever_the_tier_holds() -> None:
    for f, view in random_cases(seed=5):
        for l3 in (None, 0, f.est_hit, f.prompt_len):
            for x in with_l3(view, l3).workers:
                assert cost(x, f) == delay_cost(x, f), (f, x)


def pd(load: float, hit: int = 0, l3: int | None = 0) -> WorkerView:
    """A PD prefill instance: its load is the prompt tokens queued there."""
    return w(load=load, hit=hit, l3=l3, prefill_only=True)


def test_on_prefill_instances_without_the_tier_a_first_turn_goes_where_it_waits_least() -> None:
    # a 3,000-token template of a 4,000-token prompt; its holder has 1,000 tokens queued, so the
    # request waits 1,000 + 1,000 there against 4,000 on the idle instance
    first = req(prompt_len=4_000, turn=0)
    view = cluster(pd(1_000, hit=3_000), pd(0))
    assert L3MOVE.decide(first, view) == Decision("w0", "first-turn-balance")
    # smetric-delay's product, 1,000 x 1,001 against 4,000 x 1, sends it to the idle instance
    assert DELAY.decide(first, view).worker == "w1"
    # ... and so does the default once the global tier holds the template, which w1 then fetches
    assert L3MOVE.decide(first, with_l3(view, 3_000)).worker == "w1"


def test_on_prefill_instances_without_the_tier_a_follow_up_leaves_only_a_longer_wait() -> None:
    # 16,000 tokens of history and 1,000 new: the holder's 20,000 queued tokens make a wait of
    # 21,000 there against 17,000 on the idle instance, within twice it: the follow-up stays
    f = req(prompt_len=17_000, turn=1, est_hit=16_000)
    assert L3MOVE.decide(f, cluster(pd(20_000, hit=16_000), pd(0))) == Decision("w0", "sticky")
    # smetric-delay's product (1,000 x 20,001 against 17,000) moves it and recomputes 16,000
    assert DELAY.decide(f, cluster(pd(20_000, hit=16_000), pd(0))).reason == "overload-fallback"
    # 40,000 queued: 41,000 is more than twice 17,000
    moved = L3MOVE.decide(f, cluster(pd(40_000, hit=16_000), pd(0)))
    assert moved == Decision("w1", "overload-fallback")


def test_on_prefill_instances_the_router_waits_for_the_tier_where_its_answer_decides() -> None:
    first = req(prompt_len=4_000, turn=0)
    assert L3MOVE.needs_l3(first, with_l3(cluster(pd(1_000, hit=3_000), pd(0)), None))
    # two idle instances that hold nothing: the same choice whatever the tier holds
    assert not L3MOVE.needs_l3(first, with_l3(cluster(pd(0), pd(0)), None))
