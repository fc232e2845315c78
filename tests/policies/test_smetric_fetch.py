"""smetric-fetch on built cluster views: the global tier's hit makes a move cheap; without it the
policy is smetric."""

from __future__ import annotations

import itertools

import pytest

from smetric_router.policies import make_policy
from smetric_router.policies.smetric_fetch import FETCH, fetch_cost
from tests.policies.builders import cluster, req, w

FETCHING = make_policy("smetric-fetch")
SMETRIC = make_policy("smetric-inflight")


def test_a_loaded_holder_gives_the_follow_up_away_when_its_history_is_fetchable() -> None:
    # prompt 1000, holder hit 800 at load 4: staying 200 x 5 = 1000; an idle worker recomputes
    # 1000 x 1 without the tier (smetric keeps it: 1000 <= 2 x 1000) but fetches 800 and
    # prefills 200 with it: (200 + FETCH x 800) x 1 = 264
    view = cluster(w(load=4, hit=800, l3=800), w(load=0, l3=800))
    assert SMETRIC.decide(req(turn=1, est_hit=800), view).reason == "sticky"
    d = FETCHING.decide(req(turn=1, est_hit=800), view)
    assert (d.worker, d.reason) == ("w1", "overload-fallback")
    assert fetch_cost(view.workers[1], req()) == pytest.approx(200 + FETCH * 800)


def test_the_holder_of_what_the_tier_lacks_keeps_it() -> None:
    # the tier holds only the first 200 tokens: a move recomputes 800, as for smetric
    view = cluster(w(load=4, hit=800, l3=200), w(load=0, l3=200))
    assert FETCHING.decide(req(turn=1, est_hit=800), view).reason == "sticky"


@pytest.mark.parametrize("l3", [0, None])
def test_without_an_l3_figure_it_decides_as_smetric(l3: int | None) -> None:
    loads, hits = (0, 1, 4, 10), (0, 300, 800, 1000)
    for turn, (l0, h0), (l1, h1) in itertools.product(
        (0, 1), itertools.product(loads, hits), itertools.product(loads, hits)
    ):
        view = cluster(w(load=l0, hit=h0, l3=l3), w(load=l1, hit=h1, l3=l3), w(load=2, l3=l3))
        r = req(turn=turn, est_hit=800 if turn else 0)
        assert FETCHING.decide(r, view) == SMETRIC.decide(r, view)
