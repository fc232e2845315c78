"""A sticky follow-up whose cache holder fails before its first byte: the retry re-decides without
the holder, so another worker serves it and the holder is tried exactly once."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from smetric_router.cluster.kv_index import KvIndex
from smetric_router.features.extract import FeatureExtractor
from tests.router.conftest import MakeRouter, MakeWorker
from tests.router.fakes import FakeWorker
from tests.router.test_policy_wiring import FOLLOW_UP, store


async def holder_setup(
    make_worker: MakeWorker, make_router: MakeRouter, codec: Any, max_retries: int = 2
) -> tuple[list[FakeWorker], FakeWorker, str]:
    """Three workers; the middle one holds the follow-up's history, the others its system prompt."""
    workers = [await make_worker(n) for n in "abc"]
    holder = workers[1]
    features = FeatureExtractor(codec, page_size=16).from_chat(FOLLOW_UP)
    index = KvIndex()
    store(index, holder.url, list(features.page_hashes[: features.est_hit // 16]), 16)
    for w in workers:
        if w is not holder:
            store(index, w.url, list(features.page_hashes[:2]), 16)
    router = await make_router([w.url for w in workers], hits=index, max_retries=max_retries)
    return workers, holder, router.url


async def chat(url: str) -> tuple[int, str, str]:
    path = url + "/v1/chat/completions"
    async with aiohttp.ClientSession() as s, s.post(path, json=FOLLOW_UP) as resp:
        await resp.read()
        return resp.status, resp.headers["x-smetric-worker"], resp.headers["x-smetric-reason"]


async def test_holder_answering_5xx_is_tried_once_then_another_serves(
    make_worker: MakeWorker, make_router: MakeRouter, codec: Any
) -> None:
    workers, holder, url = await holder_setup(make_worker, make_router, codec)
    assert await chat(url) == (200, holder.url, "sticky")
    holder.bodies.clear()

    holder.fail_next = 10  # every try on the holder would fail
    status, served, reason = await chat(url)
    assert status == 200
    assert served != holder.url and served in {w.url for w in workers}
    # Without the holder the best hit is the shared system prompt: the session looks evicted.
    assert reason == "evicted-fallback"
    assert len(holder.bodies) == 1  # tried once, never again within the request


@pytest.mark.parametrize("max_retries", [1, 2])
async def test_refused_holder_is_tried_once(
    make_worker: MakeWorker, make_router: MakeRouter, codec: Any, max_retries: int
) -> None:
    workers, holder, url = await holder_setup(make_worker, make_router, codec, max_retries)
    dead = holder.url
    assert await chat(url) == (200, dead, "sticky")
    await holder.close()  # still registered healthy: the next dispatch to it is refused

    status, served, reason = await chat(url)
    assert status == 200 and served in {workers[0].url, workers[2].url}
    assert reason == "evicted-fallback"
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as resp:
        metrics = await resp.text()
    assert f'smetric_retries_total{{worker="{dead}"}} 1.0' in metrics
