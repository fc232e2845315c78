"""The in-flight prefix view: a raw-prompt follow-up sent while its prefix is still in flight (no
KV event yet) sticks to the worker it was sent to; chat first turns stay balanced."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from smetric_router.cluster.kv_index import KvIndex
from smetric_router.core.kv_events import GPU, BlockRemoved, KVEventBatch
from tests.helpers.generate import ids
from tests.helpers.polling import eventually
from tests.router.conftest import MakeRouter, MakeWorker

ROUND_1 = ids(1, 200)
ROUND_2 = ROUND_1 + ids(2, 120)  # round 1 + its reply + the next user message
SYSTEM = "You are a coding agent. " * 20


def chat(user: str) -> dict[str, Any]:
    return {
        "model": "fake-model",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
    }


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[str, str]:
    async with http.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()
        return resp.headers["x-smetric-worker"], resp.headers["x-smetric-reason"]


async def test_view_credits_the_worker_a_prefix_is_in_flight_to(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    a, b = await make_worker("a"), await make_worker("b")
    state = (await make_router([a.url, b.url], hits=KvIndex())).state
    router = state.router
    first = router.features.from_generate({"input_ids": ROUND_1})
    follow = router.features.from_generate({"input_ids": ROUND_2})
    assert router.route(follow, None).decision.reason == "first-turn-balance"

    hold = router.hold(b.url, first)  # round 1 sent to b; no KV event from b yet
    routed = router.route(follow, None)
    assert (routed.decision.worker, routed.decision.reason) == (b.url, "sticky")
    in_flight = len(first.page_hashes) * 16
    seen = {w.url: (w.hit, w.gpu_hit) for w in routed.view.workers}
    assert seen == {a.url: (0, 0), b.url: (in_flight, in_flight)}

    # Chat first turns count their own turn: one whose system prompt is in flight on b is
    # still balanced.
    opener = router.features.from_chat(chat("list the files"))
    other = router.features.from_chat(chat("open README.md"))
    chat_hold = router.hold(b.url, opener)
    assert router.route(other, None).decision.reason == "first-turn-balance"
    router.release(chat_hold, ran=False)

    # A worker found unhealthy loses its in-flight pages (it may come back restarted, empty).
    state.registry.workers[b.url].healthy = False
    assert router.route(follow, None).decision.worker == a.url
    state.registry.workers[b.url].healthy = True
    assert router.route(follow, None).decision.reason == "first-turn-balance"
    router.release(hold, ran=True)  # into the detached table: harmless
    assert state.inflight is not None and state.inflight.pages(b.url) == 0


async def _concurrent_rounds(
    make_worker: MakeWorker, make_router: MakeRouter, **overrides: Any
) -> tuple[str, tuple[str, str], str]:
    """Round 1 held at its worker (in flight, no KV event), round 2 sent meanwhile: (round 1's
    worker, round 2's (worker, reason), the router's /metrics)."""
    workers = [await make_worker(n) for n in "abc"]
    for w in workers:
        w.stall = True
    router = await make_router([w.url for w in workers], hits=KvIndex(), **overrides)
    async with aiohttp.ClientSession() as http:
        url = router.url + "/generate"
        first = asyncio.create_task(post(http, url, {"input_ids": ROUND_1}))
        await eventually(lambda: sum(len(w.bodies) for w in workers) == 1, "round 1 at a worker")
        holder = next(w for w in workers if w.bodies)
        for w in workers:
            w.stall = False  # round 1 stays held; later requests are answered at once
        second = await post(http, url, {"input_ids": ROUND_2})
        for w in workers:
            w.release.set()
        assert (await first)[0] == holder.url
        async with http.get(router.url + "/metrics") as resp:
            metrics = await resp.text()
    return holder.url, second, metrics


async def test_follow_up_sent_while_its_prefix_is_in_flight_sticks(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    holder, second, metrics = await _concurrent_rounds(make_worker, make_router)
    assert second == (holder, "sticky")
    assert "smetric_inflight_prefix_views_total 1.0" in metrics
    assert f'smetric_inflight_prefix_pages{{worker="{holder}"}}' in metrics


async def test_without_the_in_flight_view_the_follow_up_looks_like_a_first_turn(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    _, second, metrics = await _concurrent_rounds(make_worker, make_router, inflight_prefixes=False)
    assert second[1] == "first-turn-balance"
    assert "smetric_inflight_prefix_pages{" not in metrics


async def test_pages_stay_for_the_grace_after_the_request_ends(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    a, b = await make_worker("a"), await make_worker("b")
    index = KvIndex()
    router = await make_router([a.url, b.url], hits=index)
    inflight = router.state.inflight
    assert inflight is not None
    async with aiohttp.ClientSession() as http:
        home, reason = await post(http, router.url + "/generate", {"input_ids": ROUND_1})
        assert reason == "first-turn-balance"
        # Ended, KV events (none here) not in yet: still counted, then gone after the grace.
        assert inflight.pages(home) == len(ROUND_1) // 16
        assert await post(http, router.url + "/generate", {"input_ids": ROUND_2}) == (
            home,
            "sticky",
        )
        # An eviction in the worker's KV events ends the grace: the index speaks for it.
        index.apply(home, KVEventBatch(0.0, [BlockRemoved(block_hashes=[7], medium=GPU)]))
        assert inflight.pages(home) == 0
        assert (await post(http, router.url + "/generate", {"input_ids": ROUND_2}))[1] == (
            "first-turn-balance"
        )
        # A flushed worker holds nothing, whatever ended there recently.
        async with http.post(router.url + "/flush_cache") as resp:
            assert resp.status == 200
        assert inflight.pages(home) == 0
