"""Workers added and removed at run time, end to end: an emulated worker added with POST /workers
has its KV events indexed and gets its sessions' follow-ups; DELETE drops its index."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from tests.e2e.conftest import SPEEDUP, StackFactory
from tests.e2e.raw import generate, listed_workers, router_hits, token_ids, wait_indexed
from tests.reported import reported

TURN = {"x-smetric-turn": "1"}


async def test_added_worker_is_indexed_and_sticky_then_removed(
    make_stack: StackFactory, tmp_path: Path
) -> None:
    stack = make_stack(workers=1)
    (old,) = stack.worker_urls
    w = stack.spec.workers
    args = ["smetric_router.emulator", "--port", "0", "--kv-events-port", "0",
            "--kv-events-replay-port", "0", "--model-name", w.model_name,
            "--page-size", str(w.page_size), "--speedup", str(SPEEDUP),
            "--log-level", "warning"]  # fmt: skip
    with reported(args, tmp_path / "added.json") as ports:
        new = f"http://127.0.0.1:{ports['http']}"
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{stack.url}/workers", json={"url": new}) as r:
                assert r.status == 200, await r.text()
                assert (await r.json())["worker"]["url"] == new
            assert set(await listed_workers(http, stack.url)) == {old, new}

            # First requests are balanced over both: one of the first few lands on the new one.
            for seed in range(20, 24):
                session = token_ids(seed=seed, n=480)
                home, reason = await generate(http, stack.url, session, {"x-smetric-turn": "0"})
                assert reason == "first-turn-balance"
                if home == new:
                    break
            assert home == new, "no first request reached the added worker"
            # Its KV events reach the router's index...
            await wait_indexed(http, stack.url, new, session)
            # ...and its session's follow-ups stick to it.
            for turn in range(1, 3):
                session = session + token_ids(seed=100 + turn, n=64)
                assert await generate(http, stack.url, session, TURN) == (new, "sticky")

            async with http.delete(f"{stack.url}/workers", params={"url": new}) as r:
                assert r.status == 200, await r.text()
            assert set(await listed_workers(http, stack.url)) == {old}
            # Its index is gone with it: the router no longer says anyone holds the session...
            assert (await router_hits(http, stack.url, session)).get(new) is None
            assert (await router_hits(http, stack.url, session)).get(old) == 0
            # ...so its follow-up, carrying the history, is balanced to the remaining worker.
            hint = {**TURN, "x-smetric-history-tokens": str(len(session))}
            assert await generate(http, stack.url, session + [42] * 32, hint) == (
                old,
                "evicted-fallback",
            )
