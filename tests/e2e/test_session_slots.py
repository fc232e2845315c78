"""Kept session slots through a launched stack: a router capped at 1 request in flight with
--queue-session-grace-secs, in front of an emulated worker. The slot a first turn frees waits
for its conversation's follow-up, which is admitted at once past a new session queued before
it; a slot nobody claims goes to the queue when its grace ends."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from smetric_router.launch import ClusterSpec, RouterSpec, Stack, WorkerSpec
from tests.e2e.conftest import ROUTER_ARGS
from tests.helpers.polling import eventually
from tests.helpers.prometheus import total, value

MODEL = WorkerSpec().model_name
GRACE_S = 2.0
ARGS = ("--max-concurrent-requests", "1", "--queue-session-grace-secs", str(GRACE_S))
TASK = " ".join(f"refactor module {i} and keep its tests green" for i in range(12))


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    spec = ClusterSpec(
        router=RouterSpec(port=0, extra_args=ROUTER_ARGS + ARGS),
        workers=WorkerSpec(count=1, speedup=4.0),
    )
    with Stack(spec) as s:
        yield s


async def post(http: aiohttp.ClientSession, url: str, messages: list[dict[str, str]]) -> Any:
    body = {"model": MODEL, "messages": messages, "max_tokens": 8}
    async with http.post(url, json=body) as r:
        assert r.status == 200, await r.text()
        return r.headers, await r.json()


async def metric(http: aiohttp.ClientSession, url: str, name: str, **labels: str) -> float:
    async with http.get(url + "/metrics") as r:
        text = await r.text()
    return (value(text, name, **labels) if not name.endswith("_total")
            else total(text, name, **labels)) or 0.0  # fmt: skip


async def test_the_follow_up_takes_its_sessions_slot_and_new_sessions_wait(stack: Stack) -> None:
    url = stack.url + "/v1/chat/completions"
    async with aiohttp.ClientSession() as http:
        first = [{"role": "user", "content": f"session A: {TASK}"}]
        _, reply = await post(http, url, first)  # its slot is now kept for session A
        new = asyncio.create_task(post(http, url, [{"role": "user", "content": f"B: {TASK}"}]))

        async def queued() -> bool | None:
            return await metric(http, stack.url, "smetric_admission_queued") == 1 or None

        await eventually(queued, "the new session queued behind the kept slot")
        follow = [*first, reply["choices"][0]["message"], {"role": "user", "content": "go on"}]
        headers, _ = await post(http, url, follow)
        assert headers["x-smetric-admission-wait-ms"] == "0"
        assert not new.done()  # the follow-up's slot is kept again for session A's next turn
        new_headers, _ = await new
        # B waited for session A's second slot to go unclaimed
        assert int(new_headers["x-smetric-admission-wait-ms"]) >= 1000 * GRACE_S * 0.9
        slots = "smetric_admission_session_slots_total"
        assert await metric(http, stack.url, slots, outcome="claimed") == 1
        assert await metric(http, stack.url, slots, outcome="expired") >= 1
        assert await metric(http, stack.url, slots, outcome="kept") >= 2
