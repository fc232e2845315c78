"""The contract the router's lookup beside the request rests on: where a policy says its decision
does not need the global tier's answer (needs_l3 False on the view with l3_hit None), it decides
the same whatever the answer is. Checked for every registered policy on seeded random views."""

from __future__ import annotations

import pytest

from smetric_router.policies import PolicyParams, make_policy, policy_names
from tests.policies.builders import cluster, random_cases, req, w, with_l3

FOLLOW_UP = req(prompt_len=1_700, turn=1, est_hit=800)


@pytest.mark.parametrize("prefill_only", [False, True], ids=["colocated", "pd-prefill"])
@pytest.mark.parametrize("name", policy_names())
def test_a_decision_that_does_not_need_the_tier_is_the_same_whatever_it_holds(
    name: str, prefill_only: bool
) -> None:
    for params in (PolicyParams(), PolicyParams(l3_aware=True)):
        policy = make_policy(name, params)
        for f, view in random_cases(seed=len(name), prefill_only=prefill_only):
            asked = with_l3(view, None)
            if policy.needs_l3(f, asked):
                continue
            without = policy.decide(f, asked)
            for l3 in (0, 16, f.est_hit // 4, f.est_hit, f.prompt_len):
                assert policy.decide(f, with_l3(view, l3)) == without, (name, f, view, l3)


def test_l3move_waits_only_for_a_follow_up_the_answer_could_move() -> None:
    l3move = make_policy("smetric-l3move")
    # the busier holder: held in the tier, the follow-up leaves it; otherwise it stays
    busy_holder = with_l3(cluster(w(load=1, hit=800), w(load=0)), None)
    assert l3move.needs_l3(FOLLOW_UP, busy_holder)
    assert l3move.decide(FOLLOW_UP, with_l3(busy_holder, 800)).reason == "l3-move"
    assert l3move.decide(FOLLOW_UP, busy_holder).reason == "sticky"
    # an idle holder keeps it either way; a first turn never turns on the tier
    idle_holder = with_l3(cluster(w(load=0, hit=800), w(load=0)), None)
    assert not l3move.needs_l3(FOLLOW_UP, idle_holder)
    assert not l3move.needs_l3(req(prompt_len=1_700, turn=0), busy_holder)


def test_policies_that_never_read_the_tier_never_wait_for_it() -> None:
    readers = {"smetric", "smetric-l3move", "smetric-fetch"}
    f, view = FOLLOW_UP, with_l3(cluster(w(load=1, hit=800), w(load=0)), None)
    for name in policy_names():
        assert make_policy(name).needs_l3(f, view) == (name in readers), name
    # the L3-aware eviction guard reads it on every decision
    assert make_policy("smetric-inflight", PolicyParams(l3_aware=True)).needs_l3(f, view)
