"""The router's L3 view from the workers' own KV events (`--l3-view events`) over emulated workers
that announce what they write to a real Mooncake store (`--l3-kv-events`, which the launcher
gives them as the project's patched SGLang does): a prompt written through appears in the view
without the master being asked, and a clear through the worker that wrote it takes it out."""

from __future__ import annotations

from collections.abc import Iterator

import aiohttp
import pytest

from smetric_router.launch import RouterSpec, Stack, WorkerSpec
from tests.e2e.conftest import ROUTER_ARGS, mooncake_stack
from tests.e2e.raw import generate, router_l3, token_ids
from tests.helpers.polling import eventually
from tests.helpers.prometheus import metric

MODEL = WorkerSpec().model_name


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    yield from mooncake_stack(RouterSpec(port=0, l3_view="events", extra_args=ROUTER_ARGS))


async def test_written_pages_enter_the_view_and_a_clear_takes_them_out(stack: Stack) -> None:
    prompt = token_ids(seed=41, n=320)
    async with aiohttp.ClientSession() as http:
        url = stack.url
        assert await router_l3(http, url, prompt, MODEL) == 0
        holder, _ = await generate(http, url, prompt, {"x-smetric-turn": "0"})

        async def held(tokens: int) -> bool:
            return await router_l3(http, url, prompt, MODEL) == tokens

        await eventually(lambda: held(len(prompt)), "the written prompt in the router's L3 view")
        # answered from the index: the router has no master to ask
        assert metric(url, "smetric_l3_lookups_total", source="events", outcome="hit") >= 1
        async with http.post(f"{holder}/hicache/storage-backend/clear") as r:
            assert r.status == 200, await r.text()
        await eventually(lambda: held(0), "the cleared prompt out of the router's L3 view")
