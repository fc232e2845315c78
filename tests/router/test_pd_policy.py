"""The prefill policy under PD: sticky follow-ups from KV hits, unprefilled-token load."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from smetric_router.cluster.kv_index import KvIndex
from smetric_router.features.extract import FeatureExtractor
from tests.helpers.polling import eventually
from tests.router.conftest import MakeRouter, MakeWorker, RouterUnderTest
from tests.router.pd_fakes import FakeDecode, FakePrefill, Hub
from tests.router.test_policy_wiring import FOLLOW_UP, store

LONG = "Summarize the repository layout and the build steps in detail. " * 60


async def start(
    make_worker: MakeWorker, make_router: MakeRouter, n: int, **overrides: Any
) -> tuple[list[FakePrefill], FakeDecode, RouterUnderTest]:
    hub = Hub()
    ps = [await make_worker(f"p{i}", cls=FakePrefill, hub=hub) for i in range(n)]
    d = await make_worker("d", cls=FakeDecode, hub=hub)
    router = await make_router(
        [],
        pd_disaggregation=True,
        prefill=tuple((p.url, p.bootstrap_port) for p in ps),
        decode_urls=(d.url,),
        **overrides,
    )
    return ps, d, router


async def chat(s: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[str, str]:
    async with s.post(url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        return resp.headers["x-smetric-prefill-worker"], resp.headers["x-smetric-reason"]


def first_turn(i: int) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": f"{i} {LONG}"}]}


async def test_follow_up_sticks_to_its_sessions_prefill_instance(
    make_worker: MakeWorker, make_router: MakeRouter, codec: Any
) -> None:
    index = KvIndex()
    ps, d, router = await start(make_worker, make_router, 3, hits=index)
    holder = ps[2]
    features = FeatureExtractor(codec, page_size=16).from_chat(FOLLOW_UP)
    store(index, holder.url, list(features.page_hashes[: features.est_hit // 16]), 16)
    for p in ps[:2]:  # everyone holds the system prompt
        store(index, p.url, list(features.page_hashes[:2]), 16)
    async with aiohttp.ClientSession() as s:
        for _ in range(3):
            assert await chat(s, router.url, FOLLOW_UP) == (holder.url, "sticky")
        assert (await chat(s, router.url, first_turn(0)))[1] == "first-turn-balance"
    assert len(holder.bodies) >= 3 and d.bodies[0]["bootstrap_port"] == holder.bootstrap_port


async def test_without_a_tier_a_follow_up_leaves_its_prefill_only_for_a_shorter_wait(
    make_worker: MakeWorker, make_router: MakeRouter, codec: Any
) -> None:
    """The default prices a prefill instance without the global tier by the wait there: the
    tokens queued plus the request's own prefill. A holder whose queue (another router's, from
    its report) is as long as the whole prompt keeps the follow-up, since elsewhere it would
    recompute its history; three times as long, and it goes."""
    index = KvIndex()
    ps, _, router = await start(
        make_worker, make_router, 2, hits=index, load_poll_interval_secs=0.05
    )
    holder, other = ps
    features = FeatureExtractor(codec, page_size=16).from_chat(FOLLOW_UP)
    store(index, holder.url, list(features.page_hashes[: features.est_hit // 16]), 16)
    worker = router.state.registry.workers[holder.url]
    async with aiohttp.ClientSession() as s:
        for queued, expected in (
            (1, (holder.url, "sticky")),
            (3, (other.url, "overload-fallback")),
        ):
            holder.waiting_uncached = queued * features.prompt_len
            await eventually(
                lambda: worker.reported_load == holder.waiting_uncached, "the holder's report"
            )
            assert await chat(s, router.url, FOLLOW_UP) == expected


async def flood(
    s: aiohttp.ClientSession, url: str, stalled: FakePrefill, other: FakePrefill
) -> list[asyncio.Task[tuple[str, str]]]:
    """Send first turns one by one until one sits on the stalled prefill (ties round-robin)."""
    pending = []
    for i in range(4):
        pending.append(asyncio.create_task(chat(s, url, first_turn(i))))
        await eventually(
            lambda: len(stalled.bodies) + len(other.bodies) >= len(pending),
            "every request so far at a prefill",
        )
        if stalled.bodies:
            return pending
    raise AssertionError("the stalled prefill never got a request")


async def test_flooded_prefill_gets_no_first_turns_until_drained(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    (a, b), _, router = await start(make_worker, make_router, 2)
    registry = router.state.registry
    a.stall = True  # a's prefills pile up: long prompts dispatched to it and not yet prefilled
    async with aiohttp.ClientSession() as s:
        pending = await flood(s, router.url, a, b)
        await eventually(lambda: registry.workers[b.url].tokens == 0, "b done with its requests")
        flooded = registry.workers[a.url].tokens
        assert flooded > 700  # the long prompt, unprefilled (nothing of it was cached)
        async with s.get(router.url + "/workers") as resp:
            listed = {w["url"]: w for w in (await resp.json())["workers"]}
        assert listed[a.url]["load"] == flooded and listed[b.url]["load"] == 0
        for i in range(4, 8):
            assert await chat(s, router.url, first_turn(i)) == (b.url, "first-turn-balance")
        assert len(a.bodies) == 1
        a.release.set()  # drained: its prefill finishes and its tokens are returned
        await asyncio.gather(*pending)
        assert registry.workers[a.url].tokens == 0
        chosen = {(await chat(s, router.url, first_turn(i)))[0] for i in range(8, 10)}
    assert chosen == {a.url, b.url}


async def test_unprefilled_tokens_reported_by_the_worker_count_too(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    # Another router replica floods a: only a's own report says so.
    (a, b), _, router = await start(make_worker, make_router, 2, load_poll_interval_secs=0.05)
    worker = router.state.registry.workers[a.url]
    a.waiting_uncached = 50_000
    await eventually(lambda: worker.reported_load == 50_000, "a's reported waiting tokens")
    async with aiohttp.ClientSession() as s:
        for i in range(4):
            assert await chat(s, router.url, first_turn(i)) == (b.url, "first-turn-balance")
        a.waiting_uncached = 0
        await eventually(lambda: worker.reported_load == 0, "a's reported load back to 0")
        chosen = {(await chat(s, router.url, first_turn(i)))[0] for i in range(4, 6)}
    assert chosen == {a.url, b.url}


async def test_load_balance_on_prefill_counts_unprefilled_tokens(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    # load_balance under PD is Dynamo's rule: fewest unprefilled tokens, not fewest requests.
    (a, b), _, router = await start(make_worker, make_router, 2, prefill_policy="load_balance")
    a.stall = True
    async with aiohttp.ClientSession() as s:
        pending = await flood(s, router.url, a, b)
        # b counts more requests in flight than a (as if short prompts), but far fewer tokens.
        router.state.registry.workers[b.url].inflight += 3
        for i in range(4, 6):
            assert await chat(s, router.url, first_turn(i)) == (b.url, "load_balance")
        router.state.registry.workers[b.url].inflight -= 3
        a.release.set()
        await asyncio.gather(*pending)
