"""Natural eviction end to end: a worker with a small GPU cache and no host tier evicts a session's
pages under other traffic (LRU, BlockRemoved events), and the session's follow-up falls back."""

from __future__ import annotations

import aiohttp

from tests.e2e.conftest import StackFactory
from tests.e2e.raw import (
    PAGE,
    generate,
    listed_workers,
    router_hits,
    token_ids,
    wait_indexed,
)
from tests.helpers.polling import eventually

GPU_KV_TOKENS = 2048


async def test_lru_eviction_leads_to_evicted_fallback(make_stack: StackFactory) -> None:
    stack = make_stack(
        workers=2, worker_args=("--gpu-kv-tokens", str(GPU_KV_TOKENS), "--host-kv-tokens", "0")
    )
    session = token_ids(seed=10, n=640)
    async with aiohttp.ClientSession() as http:
        home, reason = await generate(http, stack.url, session)
        assert reason == "first-turn-balance"
        await wait_indexed(http, stack.url, home, session)

        # Other traffic straight to home (say, from another router) fills its cache: 3 x 1024
        # tokens through a 2048-token GPU cache push the session's older pages out.
        for seed in (11, 12, 13):
            direct, _ = await generate(http, home, token_ids(seed=seed, n=1024))
            assert direct == ""  # not through the router: no decision headers

        async def session_gone() -> bool:
            return (await router_hits(http, stack.url, session)).get(home, -1) == 0

        await eventually(session_gone, "home's eviction of the session to reach the router")
        # Pages were removed one by one (BlockRemoved), not cleared: home still holds the filler.
        pages = (await listed_workers(http, stack.url))[home]["kv_pages"]
        assert 0 < pages["gpu"] <= GPU_KV_TOKENS // PAGE and pages["host"] == 0

        follow = session + token_ids(seed=14, n=200)
        hint = {"x-smetric-turn": "1", "x-smetric-history-tokens": str(len(session))}
        _, reason = await generate(http, stack.url, follow, hint)
        assert reason == "evicted-fallback"
