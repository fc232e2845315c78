"""The contract the router's lookup beside the request rests on: where a policy says its decision
does not need the global tier's answer (needs_l3 False on the view with l3_hit None), it decides
the same whatever the answer is. Checked for every registered policy on seeded random views."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from smetric_router.core.types import ClusterView, RequestFeatures
from smetric_router.policies import PolicyParams, make_policy, policy_names
from tests.policies.builders import cluster, req, w

FOLLOW_UP = req(prompt_len=1_700, turn=1, est_hit=800)


def _with_l3(view: ClusterView, l3: int | None) -> ClusterView:
    return replace(view, workers=tuple(replace(x, l3_hit=l3) for x in view.workers))


def _cases(seed: int) -> list[tuple[RequestFeatures, ClusterView]]:
    """Random clusters of 2-5 workers, each request a first turn or a follow-up whose history
    some worker holds whole, in part or not at all (evicted), or one of unknown turn."""
    rng = random.Random(seed)
    out = []
    for tick in range(300):
        history = rng.choice((0, 160, 800, 3_200))
        prompt = history + rng.choice((16, 900, 4_000))
        workers = [
            w(
                load=rng.randrange(0, 12),
                hit=rng.choice((0, history // 4, history // 2, history)),
                running=rng.choice((None, rng.randrange(0, 8))),
                unprefilled=rng.choice((0, rng.randrange(0, 20_000))),
                healthy=rng.random() > 0.1,
            )
            for _ in range(rng.randrange(2, 6))
        ]
        if not any(x.healthy for x in workers):
            workers[0] = replace(workers[0], healthy=True)
        turn = rng.choice((0, 1, 3, None)) if history else 0
        f = req(prompt_len=prompt, turn=turn, est_hit=history)
        out.append((f, replace(cluster(*workers), tick=tick, entropy=rng.getrandbits(62))))
    return out


@pytest.mark.parametrize("name", policy_names())
def test_a_decision_that_does_not_need_the_tier_is_the_same_whatever_it_holds(name: str) -> None:
    for params in (PolicyParams(), PolicyParams(l3_aware=True)):
        policy = make_policy(name, params)
        for f, view in _cases(seed=len(name)):
            asked = _with_l3(view, None)
            if policy.needs_l3(f, asked):
                continue
            without = policy.decide(f, asked)
            for l3 in (0, f.est_hit // 4, f.est_hit, f.prompt_len):
                assert policy.decide(f, _with_l3(view, l3)) == without, (name, f, view, l3)


def test_l3move_waits_only_for_a_follow_up_the_answer_could_move() -> None:
    l3move = make_policy("smetric-l3move")
    # the busier holder: held in the tier, the follow-up leaves it; otherwise it stays
    busy_holder = _with_l3(cluster(w(load=1, hit=800), w(load=0)), None)
    assert l3move.needs_l3(FOLLOW_UP, busy_holder)
    assert l3move.decide(FOLLOW_UP, _with_l3(busy_holder, 800)).reason == "l3-move"
    assert l3move.decide(FOLLOW_UP, busy_holder).reason == "sticky"
    # an idle holder keeps it either way; a first turn never turns on the tier
    idle_holder = _with_l3(cluster(w(load=0, hit=800), w(load=0)), None)
    assert not l3move.needs_l3(FOLLOW_UP, idle_holder)
    assert not l3move.needs_l3(req(prompt_len=1_700, turn=0), busy_holder)


def test_policies_that_never_read_the_tier_never_wait_for_it() -> None:
    readers = {"smetric-l3move", "smetric-fetch"}
    f, view = FOLLOW_UP, _with_l3(cluster(w(load=1, hit=800), w(load=0)), None)
    for name in policy_names():
        assert make_policy(name).needs_l3(f, view) == (name in readers), name
    # the L3-aware eviction guard reads it on every decision
    assert make_policy("smetric", PolicyParams(l3_aware=True)).needs_l3(f, view)
