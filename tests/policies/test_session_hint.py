"""What an agent's session hint changes in SMetric's decisions, on built cluster views: only the
choices the view leaves open (ties, and where a guard sends a follow-up away from its holder).
Without a hint every decision is as before: tests/policies/test_smetric_inflight.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from smetric_router.core.types import RequestFeatures
from smetric_router.policies import make_policy
from smetric_router.policies.session_home import home, rank
from tests.policies.builders import cluster, req, w

SMETRIC = make_policy("smetric")


def hinted(features: RequestFeatures, hint: str) -> RequestFeatures:
    return replace(features, session_hint=hint)


def session_homed_at(url: str, among: list[str]) -> str:
    """A hint whose rendezvous choice among `among` is url."""
    return next(
        h for h in (f"s{i}" for i in range(10_000)) if max(among, key=lambda u: rank(h, u)) == url
    )


def test_home_is_stable_and_spreads_sessions() -> None:
    view = cluster(w(), w(), w(), w())
    homes = [home(f"session-{i}", view.workers).url for i in range(400)]
    assert homes == [home(f"session-{i}", view.workers).url for i in range(400)]
    counts = {u: homes.count(u) for u in ("w0", "w1", "w2", "w3")}
    assert min(counts.values()) > 60, counts  # ~100 each


def test_removing_a_worker_moves_only_its_own_sessions() -> None:
    view = cluster(w(), w(), w(), w())
    before = {h: home(h, view.workers).url for h in (f"s{i}" for i in range(200))}
    after = {h: home(h, view.workers[:3]).url for h in before}
    assert all(after[h] == u for h, u in before.items() if u != "w3")


def test_evicted_follow_up_goes_home_among_the_cheapest() -> None:
    # w0 held the history and lost it; w1..w3 are idle and hold none of it: a tie the hint breaks
    view = cluster(w(load=1, hit=0), w(), w(), w())
    follow = req(turn=3, est_hit=900)
    assert SMETRIC.decide(follow, view).reason == "evicted-fallback"
    hint = session_homed_at("w2", ["w1", "w2", "w3"])
    d = SMETRIC.decide(hinted(follow, hint), view)
    assert (d.worker, d.reason) == ("w2", "session-hint-fallback")
    # the same session from any replica, any tick: the same worker (round-robin without a hint)
    assert {SMETRIC.decide(follow, replace(view, tick=t)).worker for t in range(3)} == {
        "w1",
        "w2",
        "w3",
    }
    for tick in range(5):
        again = SMETRIC.decide(hinted(follow, hint), replace(view, tick=tick))
        assert again.worker == "w2"


def test_home_never_wins_over_a_cheaper_worker() -> None:
    # home w2 is busier than the others: the move goes to the cheapest, with the guard's reason
    view = cluster(w(load=1), w(load=0), w(load=3), w(load=2))
    hint = session_homed_at("w2", ["w0", "w1", "w2", "w3"])
    d = SMETRIC.decide(hinted(req(turn=1, est_hit=500), hint), view)
    assert (d.worker, d.reason) == ("w1", "evicted-fallback")


def test_overload_fallback_goes_home_among_the_cheapest_too() -> None:
    # holder w0 costs 200 x 11 > 2 x an idle worker's 1000; w1 and w2 tie, w3 costs 2000
    view = cluster(w(load=10, hit=800), w(), w(), w(load=1))
    hint = session_homed_at("w2", ["w1", "w2"])
    d = SMETRIC.decide(hinted(req(turn=1, est_hit=800), hint), view)
    assert (d.worker, d.reason) == ("w2", "session-hint-fallback")
    assert SMETRIC.decide(req(turn=1, est_hit=800), view).reason == "overload-fallback"


# the first turn: the default's least delay (w0: 200 tokens to prefill behind 2 requests), the
# least loaded for smetric-inflight
@pytest.mark.parametrize(("name", "first"), [("smetric", "w0"), ("smetric-inflight", "w2")])
def test_hint_never_overrides_a_holder_or_the_first_turn_choice(name: str, first: str) -> None:
    policy = make_policy(name)
    urls = ["w0", "w1", "w2"]
    view = cluster(w(load=2, hit=800), w(load=1), w(load=0))
    # sticky: the holder, whatever the hint's home
    for target in urls:
        d = policy.decide(hinted(req(turn=2, est_hit=800), session_homed_at(target, urls)), view)
        assert (d.worker, d.reason) == ("w0", "sticky")
    # first turn: the policy's own choice, whatever the hint's home
    for target in urls:
        d = policy.decide(hinted(req(turn=0), session_homed_at(target, urls)), view)
        assert (d.worker, d.reason) == (first, "first-turn-balance")


def test_hint_breaks_ties_instead_of_round_robin() -> None:
    urls = ["w0", "w1", "w2", "w3"]
    hint = session_homed_at("w2", ["w1", "w2", "w3"])
    # first turn: w1..w3 tie on least load
    for tick in range(4):
        view = cluster(w(load=1), w(), w(), w(), tick=tick)
        assert SMETRIC.decide(hinted(req(turn=0), hint), view).worker == "w2"
    # follow-up: w1 and w2 hold the same history (a fork, or an earlier fallback)
    hint = session_homed_at("w1", urls)
    for tick in range(4):
        view = cluster(w(), w(hit=640), w(hit=640), w(), tick=tick)
        d = SMETRIC.decide(hinted(req(turn=1, est_hit=640), hint), view)
        assert (d.worker, d.reason) == ("w1", "sticky")
