"""Health-check thresholds: a worker goes out after N missed checks in a row and comes back
after M passed ones; a refused or dropped request still excludes at once.

Each round is driven by hand (`check_health()`), the background loop being an hour apart."""

from __future__ import annotations

import aiohttp
import pytest

from smetric_router.router.config import RouterConfig
from tests.router.conftest import MakeRouter, MakeWorker, RouterUnderTest
from tests.router.fakes import DroppingWorker, FakeWorker, free_port

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


async def rounds(router: RouterUnderTest, n: int) -> None:
    for _ in range(n):
        await router.state.registry.check_health()


def healthy(router: RouterUnderTest, w: FakeWorker) -> bool:
    return router.state.registry.workers[w.url].healthy


async def comes_back_after(router: RouterUnderTest, w: FakeWorker, passes: int) -> None:
    for _ in range(passes - 1):
        await rounds(router, 1)
        assert not healthy(router, w)
    await rounds(router, 1)
    assert healthy(router, w)


async def test_a_worker_goes_out_after_the_failure_threshold_in_a_row(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    a, b = await make_worker("a"), await make_worker("b")
    router = await make_router([a.url, b.url], health_failure_threshold=3)
    a.healthy = False
    await rounds(router, 2)
    assert healthy(router, a)  # two misses: a busy worker, still in
    async with aiohttp.ClientSession() as s, s.get(router.url + "/workers") as r:
        listed = {w["url"]: w for w in (await r.json())["workers"]}
    assert listed[a.url]["health_misses"] == 2 and listed[b.url]["health_misses"] == 0
    a.healthy = True
    await rounds(router, 1)  # a pass starts the count again
    a.healthy = False
    await rounds(router, 2)
    assert healthy(router, a)
    await rounds(router, 1)
    assert not healthy(router, a)
    async with aiohttp.ClientSession() as s:
        for _ in range(3):
            async with s.post(router.url + "/v1/chat/completions", json=CHAT) as resp:
                assert resp.status == 200 and resp.headers["x-smetric-worker"] == b.url


async def test_an_excluded_worker_comes_back_after_the_success_threshold(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    a = await make_worker("a")
    router = await make_router([a.url], health_failure_threshold=1, health_success_threshold=2)
    a.healthy = False
    await rounds(router, 1)
    assert not healthy(router, a)
    a.healthy = True
    await rounds(router, 1)
    assert not healthy(router, a)  # one pass of a flapping worker is not enough
    a.healthy = False
    await rounds(router, 1)  # a miss while out starts the count again
    a.healthy = True
    await comes_back_after(router, a, 2)


async def test_a_dropped_request_excludes_at_once_and_the_success_threshold_readmits(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    budget = [1]  # whichever worker gets the request drops it
    a = await make_worker("a", cls=DroppingWorker, budget=budget)
    b = await make_worker("b", cls=DroppingWorker, budget=budget)
    router = await make_router([a.url, b.url], health_failure_threshold=5)
    async with (
        aiohttp.ClientSession() as s,
        s.post(router.url + "/v1/chat/completions", json=CHAT) as r,
    ):
        assert r.status == 502
    dropped = a if a.bodies else b
    assert not healthy(router, dropped)  # out without waiting for five health checks
    await comes_back_after(router, dropped, 2)


async def test_a_worker_that_never_answered_comes_in_on_its_first_pass(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    port = free_port()
    late = FakeWorker("late", port=port)
    router = await make_router([f"http://127.0.0.1:{port}"], health_success_threshold=3)
    assert not router.state.registry.healthy()
    await late.start()
    try:
        await rounds(router, 1)
        assert healthy(router, late)
    finally:
        await late.close()


def test_thresholds_below_one_are_refused() -> None:
    urls = ("http://127.0.0.1:1",)
    with pytest.raises(ValueError, match="health_failure_threshold must be >= 1"):
        RouterConfig(worker_urls=urls, health_failure_threshold=0)
    with pytest.raises(ValueError, match="health_success_threshold must be >= 1"):
        RouterConfig(worker_urls=urls, health_success_threshold=0)
