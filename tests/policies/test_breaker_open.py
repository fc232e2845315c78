"""A follow-up whose holder's circuit is open falls back as if its history were evicted."""

from __future__ import annotations

from dataclasses import replace

import pytest

from smetric_router.core.types import NoWorkerAvailable, Reason, RequestFeatures
from smetric_router.policies import PolicyParams, make_policy
from tests.policies.builders import cluster, req, w

SMETRIC = make_policy("smetric", PolicyParams())


def test_an_open_holder_sends_the_follow_up_elsewhere_with_the_reason() -> None:
    view = cluster(replace(w(load=0, hit=900), breaker_open=True), w(load=1), w(load=2, hit=16))
    d = SMETRIC.decide(req(turn=3, est_hit=900), view)
    assert d.reason == Reason.BREAKER_OPEN.value
    assert d.worker in ("w1", "w2")


def test_the_same_holder_closed_keeps_its_session() -> None:
    view = cluster(w(load=0, hit=900), w(load=1), w(load=2, hit=16))
    d = SMETRIC.decide(req(turn=3, est_hit=900), view)
    assert (d.worker, d.reason) == ("w0", Reason.STICKY.value)


def test_an_open_worker_gets_no_first_turn() -> None:
    view = cluster(replace(w(load=0), breaker_open=True), w(load=5))
    d = SMETRIC.decide(req(turn=0), view)
    assert (d.worker, d.reason) == ("w1", Reason.FIRST_TURN_BALANCE.value)


def test_another_holder_of_the_history_keeps_it_sticky() -> None:
    view = cluster(replace(w(hit=900), breaker_open=True), w(load=1, hit=880))
    d = SMETRIC.decide(req(turn=3, est_hit=900), view)
    assert (d.worker, d.reason) == ("w1", Reason.STICKY.value)


def test_a_session_hint_keeps_the_breaker_reason() -> None:
    view = cluster(replace(w(hit=900), breaker_open=True), w(), w())
    hinted: RequestFeatures = replace(req(turn=3, est_hit=900), session_hint="s-1")
    assert SMETRIC.decide(hinted, view).reason == Reason.BREAKER_OPEN.value


def test_an_unhealthy_holder_is_still_evicted_fallback() -> None:
    view = cluster(w(hit=900, healthy=False), w(load=1))
    assert SMETRIC.decide(req(turn=3, est_hit=900), view).reason == "evicted-fallback"


def test_raw_prompts_still_see_the_open_holder_as_a_follow_up() -> None:
    # no counted turn: the exclusive hit on the open holder says it follows up
    view = cluster(replace(w(hit=900), breaker_open=True), w(load=1), w(load=2))
    d = SMETRIC.decide(req(turn=None, est_hit=900), view)
    assert d.reason == Reason.BREAKER_OPEN.value


@pytest.mark.parametrize("name", ["smetric", "smetric-paper", "load_balance", "lmetric"])
def test_no_policy_places_on_an_open_worker(name: str) -> None:
    policy = make_policy(name, PolicyParams())
    view = cluster(replace(w(load=0, hit=900), breaker_open=True), w(load=3))
    for turn in (0, 2):
        assert policy.decide(req(turn=turn, est_hit=900), view).worker == "w1"


def test_all_open_is_no_worker_available() -> None:
    view = cluster(replace(w(), breaker_open=True))
    with pytest.raises(NoWorkerAvailable):
        SMETRIC.decide(req(), view)
