"""A colocated worker's unprefilled tokens: a request's new tokens count at its worker from its
dispatch to its first byte (a non-streamed one to its answer), and `smetric-ftwork` places first
turns by them; through HTTP with fake workers holding their answers."""

from __future__ import annotations

import asyncio

import aiohttp

from smetric_router.cluster.kv_index import KvIndex
from tests.helpers.generate import ids, post
from tests.helpers.polling import eventually
from tests.router.conftest import MakeRouter, MakeWorker


async def test_new_tokens_count_until_the_first_byte_and_first_turns_avoid_them(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    a, b = await make_worker("a"), await make_worker("b")
    for w in (a, b):
        w.hold_stream = True  # the first chunk goes out, the rest waits for `release`
    router = await make_router([a.url, b.url], hits=KvIndex(), policy="smetric-ftwork")
    workers = router.state.registry.workers
    async with aiohttp.ClientSession() as http:
        url = router.url + "/generate"
        decoding = asyncio.create_task(post(http, url, {"input_ids": ids(1, 200), "stream": True}))
        await eventually(
            lambda: (
                sum(w.inflight for w in workers.values()) == 1
                and all(w.unprefilled == 0 for w in workers.values())
            ),
            "the first request past its first byte",
        )
        busy = next(w for w in workers.values() if w.inflight == 1)
        other = next(w for w in workers.values() if w is not busy)
        for fake in (a, b):
            fake.stall = True  # from now on nothing answers, not even a first byte
        queued = asyncio.create_task(post(http, url, {"input_ids": ids(2, 120), "stream": True}))
        await eventually(lambda: other.inflight == 1, "the second request at the idle worker")
        assert (busy.unprefilled, other.unprefilled) == (0, 120)
        async with http.get(router.url + "/workers") as resp:
            shown = {w["url"]: w["unprefilled"] for w in (await resp.json())["workers"]}
        assert shown == {busy.url: 0, other.url: 120}

        # Both have one request in flight; only `other` has a prompt waiting for its prefill.
        third = router.state.router.features.from_generate({"input_ids": ids(3, 64)})
        for _ in range(4):
            d = router.state.router.route(third, None).decision
            assert (d.worker, d.reason) == (busy.url, "first-turn-balance")

        for fake in (a, b):
            fake.stall = False
            fake.release.set()
        assert (await decoding)[0] == 200 and (await queued)[0] == 200
    assert all((w.inflight, w.unprefilled) == (0, 0) for w in workers.values())


async def test_a_non_streamed_request_counts_until_its_answer_and_an_error_gives_it_back(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    a = await make_worker("a")
    a.stall = True
    router = await make_router([a.url], hits=KvIndex())
    worker = router.state.registry.workers[a.url]
    async with aiohttp.ClientSession() as http:
        url = router.url + "/generate"
        pending = asyncio.create_task(post(http, url, {"input_ids": ids(4, 80)}))
        await eventually(lambda: worker.inflight == 1, "the request at the worker")
        assert worker.unprefilled == 80
        a.stall = False
        a.release.set()
        assert await pending == (200, a.url)
        assert worker.unprefilled == 0

        a.fail_next = 1  # a 503 before any byte, and no other worker to retry on
        assert (await post(http, url, {"input_ids": ids(5, 48)}))[0] == 503
        assert (worker.inflight, worker.unprefilled) == (0, 0)


async def test_a_workers_report_adds_the_uncached_tokens_other_routers_queued_there(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    a, b = await make_worker("a"), await make_worker("b")
    a.stall = True
    router = await make_router([a.url, b.url], hits=KvIndex(), policy="smetric-ftwork")
    registry = router.state.registry
    wa, wb = registry.workers[a.url], registry.workers[b.url]
    b.waiting_uncached_tokens = 5000  # prompts another router sent, waiting for their prefill
    await registry.poll_loads()
    first = router.state.router.features.from_generate({"input_ids": ids(6, 64)})
    for _ in range(4):
        d = router.state.router.route(first, None).decision
        assert (d.worker, d.reason) == (a.url, "first-turn-balance")

    async with aiohttp.ClientSession() as http:
        url = router.url + "/generate"
        pending = asyncio.create_task(post(http, url, {"input_ids": ids(7, 120), "stream": True}))
        await eventually(lambda: wa.unprefilled == 120, "the request held at a")
        a.waiting_uncached_tokens = 120  # a reports our own waiting prompt: nothing foreign
        await registry.poll_loads()
        async with http.get(router.url + "/workers") as resp:
            shown = {w["url"]: w["unprefilled_load"] for w in (await resp.json())["workers"]}
        assert shown == {a.url: 120, b.url: 5000}
        async with http.get(router.url + "/metrics") as resp:
            metrics = await resp.text()
        assert f'smetric_worker_unprefilled_tokens{{worker="{b.url}"}} 5000.0' in metrics
        assert router.state.router.route(first, None).decision.worker == a.url

        b.waiting_uncached_tokens = 0  # the other router's prompts were prefilled
        await registry.poll_loads()
        assert wb.unprefilled_load(now=wb.reported_at, max_age=1.0) == 0
        assert router.state.router.route(first, None).decision.worker == b.url
        a.stall = False
        a.release.set()
        assert (await pending)[0] == 200
