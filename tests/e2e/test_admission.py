"""Admission control through a launched stack: a router capped at 2 requests in flight with 4
places in its queue, in front of 2 emulated workers. A flood is answered in part with 429 and
Retry-After in each API's error shape; a running session's follow-up is admitted before new
sessions that queued earlier; a client that goes away while queued frees its place; the router
serves on afterwards."""

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

CAP, QUEUE = 2, 4
MODEL = WorkerSpec().model_name
# Emulated time at 4x: a 1200-token answer holds its slot ~4 s, long enough to queue behind.
SPEEDUP = 4.0
LONG, SHORT = 1200, 8
ADMISSION_ARGS = ("--max-concurrent-requests", str(CAP), "--queue-size", str(QUEUE),
                  "--queue-timeout-secs", "30")  # fmt: skip


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    spec = ClusterSpec(
        router=RouterSpec(port=0, extra_args=ROUTER_ARGS + ADMISSION_ARGS),
        workers=WorkerSpec(count=2, speedup=SPEEDUP),
    )
    with Stack(spec) as s:
        yield s


def chat(text: str, tokens: int, history: int = 0) -> dict[str, Any]:
    """A chat body; history > 0: a follow-up carrying that many earlier turns."""
    messages: list[dict[str, str]] = []
    for i in range(history):
        messages += [{"role": "user", "content": f"{text} step {i}"},
                     {"role": "assistant", "content": f"done step {i} of {text}"}]  # fmt: skip
    messages.append({"role": "user", "content": text})
    return {"model": MODEL, "messages": messages, "max_tokens": tokens, "ignore_eos": True}


BODIES: dict[str, Any] = {
    "/v1/chat/completions": lambda i: chat(f"flood {i}", LONG // 4),
    "/v1/messages": lambda i: {"model": MODEL, "max_tokens": LONG // 4,
                               "messages": [{"role": "user", "content": f"flood {i}"}]},
    "/v1/responses": lambda i: {"model": MODEL, "input": f"flood {i}",
                                "max_output_tokens": LONG // 4, "store": False},
}  # fmt: skip


async def post(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[int, dict[str, str], Any]:
    async with http.post(url, json=body) as r:
        return r.status, dict(r.headers), await r.json()


async def metrics(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(url + "/metrics") as r:
        return await r.text()


async def settled(http: aiohttp.ClientSession, url: str) -> None:
    """Nothing queued and nothing admitted: no place or slot left behind."""

    async def check() -> bool | None:
        text = await metrics(http, url)
        empty = value(text, "smetric_admission_queued") == 0
        return (empty and value(text, "smetric_admission_running") == 0) or None

    await eventually(check, "the admission queue and slots empty")


async def gauge_at(http: aiohttp.ClientSession, url: str, name: str, want: float) -> None:
    async def check() -> bool | None:
        return value(await metrics(http, url), name) == want or None

    await eventually(check, f"{name} == {want}")


@pytest.mark.parametrize("path", list(BODIES))
async def test_a_flood_gets_429_with_retry_after_in_the_apis_shape(stack: Stack, path: str) -> None:
    async with aiohttp.ClientSession() as http:
        replies = await asyncio.gather(
            *(post(http, stack.url + path, BODIES[path](i)) for i in range(12))
        )
        statuses = sorted(s for s, _, _ in replies)
        assert statuses.count(200) >= CAP and 429 in statuses, statuses
        assert set(statuses) == {200, 429}, statuses
        for status, headers, body in replies:
            if status != 429:
                continue
            assert int(headers["Retry-After"]) >= 1
            assert headers["x-smetric-shed"] == "queue_full"
            if path == "/v1/messages":
                assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
                assert "capacity" in body["error"]["message"]
            else:
                err = body["error"]
                assert err["code"] == "rate_limit_exceeded" and "capacity" in err["message"]
        await settled(http, stack.url)
        # served on afterwards
        status, headers, _ = await post(http, stack.url + path, BODIES[path](99))
        assert status == 200 and headers["x-smetric-admission-wait-ms"] == "0"
        text = await metrics(http, stack.url)
        assert total(text, "smetric_admission_shed_total", reason="queue_full") >= 1


async def test_a_follow_up_is_admitted_before_new_sessions_queued_earlier(stack: Stack) -> None:
    url = stack.url + "/v1/chat/completions"
    async with aiohttp.ClientSession() as http:
        await settled(http, stack.url)
        blockers = [asyncio.create_task(post(http, url, chat(f"blocker {i}", LONG)))
                    for i in range(CAP)]  # fmt: skip
        await gauge_at(http, stack.url, "smetric_admission_running", CAP)
        news = []
        for i in range(QUEUE - 1):
            news.append(asyncio.create_task(post(http, url, chat(f"new session {i}", SHORT))))
            await gauge_at(http, stack.url, "smetric_admission_queued", i + 1)
        follow = asyncio.create_task(post(http, url, chat("running session", SHORT, history=2)))
        await gauge_at(http, stack.url, "smetric_admission_queued", QUEUE)
        status, headers, _ = await follow
        assert status == 200
        order = int(headers["x-smetric-admission-order"])
        new_orders = []
        for task in news:
            s, h, _ = await task
            assert s == 200
            new_orders.append(int(h["x-smetric-admission-order"]))
        # the follow-up came last but went first; the new sessions went oldest first
        assert order < min(new_orders), (order, new_orders)
        assert new_orders == sorted(new_orders), new_orders
        assert int(headers["x-smetric-admission-wait-ms"]) > 0
        for task in blockers:
            assert (await task)[0] == 200
        await settled(http, stack.url)


async def test_a_client_gone_while_queued_frees_its_place(stack: Stack) -> None:
    url = stack.url + "/v1/chat/completions"
    async with aiohttp.ClientSession() as http:
        await settled(http, stack.url)
        before = total(await metrics(http, stack.url), "smetric_admission_shed_total",
                       reason="cancelled")  # fmt: skip
        blockers = [asyncio.create_task(post(http, url, chat(f"hold {i}", LONG)))
                    for i in range(CAP)]  # fmt: skip
        await gauge_at(http, stack.url, "smetric_admission_running", CAP)
        gone = asyncio.create_task(post(http, url, chat("impatient", SHORT)))
        await gauge_at(http, stack.url, "smetric_admission_queued", 1)
        gone.cancel()  # closes its connection: the router's handler is cancelled
        with pytest.raises(asyncio.CancelledError):
            await gone

        async def left() -> bool | None:
            text = await metrics(http, stack.url)
            shed = total(text, "smetric_admission_shed_total", reason="cancelled")
            return (value(text, "smetric_admission_queued") == 0 and shed == before + 1) or None

        await eventually(left, "the cancelled request out of the queue")
        for task in blockers:
            assert (await task)[0] == 200
        await settled(http, stack.url)
        status, _, _ = await post(http, url, chat("after", SHORT))
        assert status == 200
