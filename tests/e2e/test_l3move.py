"""smetric-l3move through a router over emulated workers on a real Mooncake store: a follow-up
whose history the store holds leaves its busy holder for an idle worker (reason l3-move), where
smetric-delay's factor of two would keep it waiting there; with the router's L3 view from the
master and from the workers' L3 KV events alike."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import pytest

from smetric_router.launch import RouterSpec, Stack, WorkerSpec
from tests.e2e.conftest import ROUTER_ARGS, mooncake_stack
from tests.e2e.raw import fault, generate, listed_workers, router_l3, token_ids, wait_indexed
from tests.helpers.polling import eventually

MODEL = WorkerSpec().model_name
STALLED_S = 30.0  # a request answered by an idle emulated worker takes well under a second


# the router's L3 view: asking the master, or the workers' own L3 KV events
@pytest.fixture(scope="module", params=["master", "events"])
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    args = (*ROUTER_ARGS, "--l3-cache-ttl-secs", "0")
    router = RouterSpec(port=0, policy="smetric-l3move", l3_view=request.param, extra_args=args)
    yield from mooncake_stack(router)


async def test_a_follow_up_the_store_holds_moves_off_its_busy_holder(stack: Stack) -> None:
    history = token_ids(seed=31, n=320)
    follow_up = {"x-smetric-turn": "1", "x-smetric-history-tokens": str(len(history))}
    async with aiohttp.ClientSession() as http:
        url = stack.url
        holder, reason = await generate(http, url, history, {"x-smetric-turn": "0"})
        assert reason == "first-turn-balance"
        (idle,) = [u for u in stack.worker_urls if u != holder]
        await wait_indexed(http, url, holder, history)

        async def stored() -> bool:  # the holder wrote the history through to the store
            return await router_l3(http, url, history, MODEL) == len(history)

        await eventually(stored, "the history in the router's L3 view")

        # One request of the session in flight on its holder, which answers nothing yet: it
        # waits there with its 16 new tokens unprefilled.
        await fault(http, holder, stall=True)
        waiting = asyncio.ensure_future(generate(http, url, history + token_ids(32, 16), follow_up))
        try:

            async def dispatched() -> bool:
                inflight: int = (await listed_workers(http, url))[holder]["inflight"]
                return inflight == 1

            await eventually(dispatched, "the first follow-up in flight on its holder")
            # 400 new tokens: 16 queued + 400 x (1 + 1) = 816 on the holder against 720 x 1 on
            # the idle worker, which fetches the history from the store (smetric-delay stays:
            # 816 is within twice 720)
            moving = generate(http, url, history + token_ids(33, 400), follow_up)
            try:  # routed to the stalled holder it would get no answer
                moved = await asyncio.wait_for(moving, STALLED_S)
            except TimeoutError:
                pytest.fail(f"the follow-up waited {STALLED_S} s on its stalled holder")
            assert moved == (idle, "l3-move")
        finally:
            await fault(http, holder, stall=False)
        assert await waiting == (holder, "sticky")
