"""A worker's recent tokens: the new prompt tokens routed there, summed with a half-life, and
`smetric-ftrecent` placing first turns by them; the sum itself, then through HTTP with fake
workers."""

from __future__ import annotations

import math

import aiohttp
import pytest

from smetric_router.cluster.kv_index import KvIndex
from smetric_router.core.decay import DecayingSum
from tests.helpers.generate import ids, post
from tests.helpers.prometheus import value
from tests.router.conftest import MakeRouter, MakeWorker

RECENT = "smetric_worker_recent_tokens"


def test_a_decaying_sum_halves_every_half_life_and_adds_on_top() -> None:
    s = DecayingSum(10.0)
    s.add(800, now=100.0)
    assert s.value(100.0) == 800
    assert s.value(110.0) == pytest.approx(400)
    assert s.value(130.0) == pytest.approx(100)
    s.add(100, now=110.0)
    assert s.value(110.0) == pytest.approx(500)
    assert s.value(105.0) == pytest.approx(500)  # an earlier time reads the latest value


@pytest.mark.parametrize("half_life", [0.0, -1.0, math.nan])
def test_a_half_life_that_is_not_positive_is_refused(half_life: float) -> None:
    with pytest.raises(ValueError, match="half_life"):
        DecayingSum(half_life)


async def test_first_turns_go_where_the_fewest_tokens_were_sent_lately(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    a, b = await make_worker("a"), await make_worker("b")
    router = await make_router([a.url, b.url], hits=KvIndex(), policy="smetric-ftrecent")
    async with aiohttp.ClientSession() as http:
        url = router.url + "/generate"
        status, big = await post(http, url, {"input_ids": ids(1, 600)})
        assert status == 200
        small = b.url if big == a.url else a.url
        async with http.get(router.url + "/metrics") as resp:
            text = await resp.text()
        assert value(text, RECENT, worker=big) == pytest.approx(600, rel=1e-3)
        assert value(text, RECENT, worker=small) == 0
        # Nothing is in flight anywhere now; every later first turn is smaller than the first,
        # so each goes to the other worker, where round-robin would alternate.
        for seed in (2, 3, 4):
            status, chosen = await post(http, url, {"input_ids": ids(seed, 150)})
            assert (status, chosen) == (200, small)
        async with http.get(router.url + "/metrics") as resp:
            text = await resp.text()
        assert value(text, RECENT, worker=small) == pytest.approx(450, rel=1e-3)
