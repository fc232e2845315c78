"""Raw-prompt traffic for the launched stacks: /generate with token ids (no tokenizer or chat
template between the test and the workers' caches), and what the router's index says of them."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import aiohttp

from tests.helpers.polling import eventually

PAGE = 16  # the stacks' page size (WorkerSpec default)


def token_ids(seed: int, n: int) -> list[int]:
    """n token ids of the bundled vocabulary, distinct per seed from the first page on."""
    rng = random.Random(seed)
    return [rng.randrange(1000, 30000) for _ in range(n)]


async def generate(
    http: aiohttp.ClientSession,
    url: str,
    ids: list[int],
    headers: Mapping[str, str] | None = None,
    max_new_tokens: int = 4,
) -> tuple[str, str]:
    """POST /generate; (x-smetric-worker, x-smetric-reason) of a 200 answer."""
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": max_new_tokens}}
    async with http.post(f"{url}/generate", json=body, headers=headers) as r:
        assert r.status == 200, await r.text()
        await r.read()
        return r.headers.get("x-smetric-worker", ""), r.headers.get("x-smetric-reason", "")


async def prefix_match(
    http: aiohttp.ClientSession, router: str, ids: list[int], model: str | None = None
) -> dict[str, Any]:
    """The router's POST /smetric/prefix_match answer for `ids` (per worker in "results", the
    global tier in "l3")."""
    body: dict[str, Any] = (
        {"input_ids": ids} if model is None else {"input_ids": ids, "model": model}
    )
    async with http.post(f"{router}/smetric/prefix_match", json=body) as r:
        assert r.status == 200, await r.text()
        answer: dict[str, Any] = await r.json()
    return answer


async def router_hits(http: aiohttp.ClientSession, router: str, ids: list[int]) -> dict[str, int]:
    """Per worker, the GPU-tier prefix of `ids` the router's KV-event index says it holds."""
    result: dict[str, Any] = (await prefix_match(http, router, ids))["results"][0]
    return {url: int(tiers["device"]) for url, tiers in result.items()}


async def router_l3(http: aiohttp.ClientSession, router: str, ids: list[int], model: str) -> int:
    """Leading tokens of `ids` the router's L3 view finds in the global tier."""
    return int((await prefix_match(http, router, ids, model))["l3"][0])


async def fault(http: aiohttp.ClientSession, worker: str, **faults: object) -> None:
    """Arm (or clear) an emulated worker's faults (its POST /emulator/faults)."""
    async with http.post(f"{worker}/emulator/faults", json=faults) as r:
        assert r.status == 200, await r.text()


async def listed_workers(http: aiohttp.ClientSession, router: str) -> dict[str, dict[str, Any]]:
    async with http.get(f"{router}/workers") as r:
        assert r.status == 200
        return {w["url"]: w for w in (await r.json())["workers"]}


async def wait_indexed(
    http: aiohttp.ClientSession, router: str, worker: str, ids: list[int]
) -> None:
    """Until the router's index has every full page of `ids` on `worker`."""
    full = len(ids) // PAGE * PAGE

    async def held() -> bool:
        return (await router_hits(http, router, ids)).get(worker, 0) >= full

    await eventually(held, f"{worker}'s KV events for {full} tokens to reach the router")


async def stream_cut_by_its_worker(router: str, worker: str, path: str, body: Any) -> list[str]:
    """Stream `body` to `path` through the router while `worker` (the only one) dies after its
    first event; the SSE frames the client got."""
    async with aiohttp.ClientSession() as http:
        await fault(http, worker, die_mid_stream_next=1)
        async with http.post(router + path, json=body) as r:
            assert r.status == 200
            text = (await r.read()).decode()
    return [f for f in text.split("\n\n") if f.strip()]
