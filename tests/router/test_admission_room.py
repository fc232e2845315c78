"""Admission's per-worker room through the router (--max-queued-requests-per-worker): a first
turn waits while every worker that can take it reports a full queue, and a worker whose circuit
is open is not room, whatever it reports."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.helpers.polling import eventually
from tests.router.conftest import MakeRouter, MakeWorker

CHAT: dict[str, Any] = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


async def post(url: str) -> tuple[int, str | None]:
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/chat/completions", json=CHAT) as r:
        await r.read()
        return r.status, r.headers.get("x-smetric-worker")


async def loads(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as s, s.get(url + "/workers") as r:
        return {w["url"]: w["load"] for w in (await r.json())["workers"]}


async def test_first_turns_wait_for_a_queue_with_room_on_a_worker_that_takes_requests(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    a, b = await make_worker("a"), await make_worker("b")
    for w in (a, b):  # one running, one waiting: a full queue at a bound of 1
        w.running_reqs, w.waiting_reqs = 1, 1
    router = await make_router(
        [a.url, b.url],
        max_queued_requests_per_worker=1,
        queue_timeout_secs=0.5,
        # reports count for three intervals: a slow poll on a busy machine must not read as empty
        load_poll_interval_secs=0.5,
        cb_failure_threshold=1,
        cb_timeout_duration_secs=600,
    )

    async def reported(want: dict[str, float]) -> bool:
        return await loads(router.url) == want

    await eventually(lambda: reported({a.url: 2, b.url: 2}), "both workers' reports")
    assert await post(router.url) == (429, None)  # no queue with room: it waited, then shed

    b.waiting_reqs = 0
    await eventually(lambda: reported({a.url: 2, b.url: 1}), "b's queue to empty")
    assert await post(router.url) == (200, b.url)

    b.fail_next, b.fail_status = 1, 500  # b fails once: its circuit opens, a serves the retry
    assert await post(router.url) == (200, a.url)
    async with aiohttp.ClientSession() as s, s.get(router.url + "/workers") as r:
        circuits = {w["url"]: w["circuit"]["state"] for w in (await r.json())["workers"]}
    assert circuits == {a.url: "closed", b.url: "open"}
    # b still reports room, but takes no requests: a first turn has nowhere to go
    assert await post(router.url) == (429, None)
    assert len(a.bodies) == 1
