"""Overload and evicted fallbacks provoked end to end: a flooded worker, a flushed worker."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from tests.e2e.conftest import StackFactory
from tests.helpers.polling import eventually


class Session:
    """One agent conversation sent through the router."""

    def __init__(self, http: aiohttp.ClientSession, url: str, model: str, tag: str) -> None:
        self.http, self.url, self.model = http, url, model
        self.messages: list[dict[str, str]] = [
            {"role": "system", "content": f"Agent {tag}. " * 20},
            {"role": "user", "content": f"Task {tag}: refactor the parser module. " * 10},
        ]

    async def turn(self) -> tuple[str, str]:
        body = {"model": self.model, "messages": self.messages, "max_tokens": 24}
        async with self.http.post(f"{self.url}/v1/chat/completions", json=body) as r:
            assert r.status == 200, await r.text()
            reply = await r.json()
            decision = (r.headers["x-smetric-worker"], r.headers["x-smetric-reason"])
        self.messages.append(
            {"role": "assistant", "content": reply["choices"][0]["message"]["content"]}
        )
        self.messages.append({"role": "user", "content": "Tool result: tests pass. " * 8})
        return decision


async def worker_state(http: aiohttp.ClientSession, router: str, worker: str) -> dict[str, Any]:
    async with http.get(f"{router}/workers") as r:
        workers = (await r.json())["workers"]
    return next(w for w in workers if w["url"] == worker)


async def flood(http: aiohttp.ClientSession, worker: str) -> None:
    # 12 x 8K tokens fit beside the session's pages: the flood loads the worker without evicting.
    body = {"text": "flood " * 64, "sampling_params": {"max_new_tokens": 8000}, "stream": True}
    async with http.post(f"{worker}/generate", json=body) as r:
        async for _ in r.content.iter_any():
            pass


async def test_flooded_worker_triggers_overload_fallback(make_stack: StackFactory) -> None:
    stack = make_stack(policy="smetric")
    async with aiohttp.ClientSession() as http:
        s = Session(http, stack.url, stack.spec.workers.model_name, "overload")
        home, reason = await s.turn()
        assert reason == "first-turn-balance"
        assert (await s.turn()) == (home, "sticky")

        # Requests sent to the worker behind the router's back (say, by another router replica)
        # reach the router through the worker's /v1/loads.
        floods = [asyncio.create_task(flood(http, home)) for _ in range(12)]
        try:

            async def home_loaded() -> bool:
                load: int = (await worker_state(http, stack.url, home))["load"]
                return load >= 12

            await eventually(home_loaded, "the flood to show in the router's load view")
            worker, reason = await s.turn()
            assert reason == "overload-fallback"
            assert worker != home
        finally:
            for f in floods:
                f.cancel()
            await asyncio.gather(*floods, return_exceptions=True)


async def test_flushed_worker_triggers_evicted_fallback(make_stack: StackFactory) -> None:
    stack = make_stack(policy="smetric")
    async with aiohttp.ClientSession() as http:
        s = Session(http, stack.url, stack.spec.workers.model_name, "evicted")

        async def indexed(worker: str) -> None:
            # the reply's KV events reach the router asynchronously; a busy machine delays them
            async def has_pages() -> bool:
                return bool((await worker_state(http, stack.url, worker))["kv_pages"]["gpu"])

            await eventually(has_pages, f"{worker}'s KV events to reach the router")

        home, reason = await s.turn()
        assert reason == "first-turn-balance"
        await indexed(home)
        assert (await s.turn()) == (home, "sticky")

        async with http.post(f"{home}/flush_cache") as r:
            assert r.status == 200, await r.text()

        async def home_empty() -> bool:
            pages: int = (await worker_state(http, stack.url, home))["kv_pages"]["gpu"]
            return pages == 0

        await eventually(home_empty, "the flush to reach the router through KV events")
        fallback, reason = await s.turn()
        assert reason == "evicted-fallback"
        # The fallback worker now holds the session: the next turn sticks there again.
        await indexed(fallback)
        assert (await s.turn()) == (fallback, "sticky")
