"""A busy router must keep up with its workers' KV events.

When the feed read one batch per wake-up of its poll loop, an event loop busy with HTTP handlers
consumed fewer batches per second than the workers published: the backlog piled up in libzmq's
native memory (router RSS 60 -> 340 MB over 30K requests, the Python heap flat) and the index
lagged the workers' caches. Here a hog task stands in for the HTTP handlers (5 ms per loop turn,
so at most ~200 turns/s) while a worker publishes a burst of 2,000 batches: one batch per turn
needs >= 10 s; draining the socket takes a fraction of a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from smetric_router.cluster.kv_index import KvIndex
from smetric_router.cluster.subscriber import KvEventFeed
from smetric_router.emulator.kv_publisher import KvEventPublisher
from tests.helpers.kv_events import stored
from tests.helpers.polling import eventually

PAGE = 16
BURST = 2000
TURN_S = 0.005
DEADLINE_S = 5.0  # a feed that reads one batch per turn needs BURST * TURN_S = 10 s at least


@contextlib.asynccontextmanager
async def serving_worker(replay: bool = False) -> AsyncIterator[tuple[str, KvEventPublisher]]:
    """A worker's /server_info naming a real KV-event publisher (with a replay socket if asked);
    yields (its URL, the publisher)."""
    pub = KvEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*" if replay else None, topic="kv")
    kv = {
        "publisher": "zmq",
        "endpoint_host": "127.0.0.1",
        "topic": "kv",
        "block_size": PAGE,
        "endpoint_port_base": int(pub.endpoint.rsplit(":", 1)[1]),
        "dp_size": 1,
    }
    if replay:
        kv["replay_endpoint_port_base"] = int(str(pub.replay_endpoint).rsplit(":", 1)[1])

    async def info(_: web.Request) -> web.Response:
        return web.json_response({"page_size": PAGE, "kv_events": kv})

    app = web.Application()
    app.router.add_get("/server_info", info)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}", pub
    finally:
        await server.close()
        pub.close()


@pytest.fixture
async def worker() -> AsyncIterator[tuple[str, KvEventPublisher]]:
    async with serving_worker() as w:
        yield w


async def hog() -> None:
    """HTTP handlers' work: every loop turn costs TURN_S of blocking CPU."""
    while True:
        time.sleep(TURN_S)
        await asyncio.sleep(0)


async def test_busy_loop_keeps_up_with_a_burst_of_batches(
    worker: tuple[str, KvEventPublisher],
) -> None:
    url, pub = worker
    index = KvIndex()
    feed = KvEventFeed(url, index)
    feed.start()
    busy: asyncio.Task[None] | None = None
    try:
        deadline = time.monotonic() + 10
        while feed.live_seq < 0:  # the SUB socket joins late: publish until it hears one
            assert time.monotonic() < deadline, "feed never joined the live stream"
            pub.publish([stored([-1], None)])
            await asyncio.sleep(0.02)
        await eventually(lambda: feed.last_seq == pub.next_seq - 1, "feed caught up", 10)
        busy = asyncio.create_task(hog())
        for i in range(BURST):
            pub.publish([stored([10 * i + 1, 10 * i + 2], None)])
        burst = time.monotonic()
        await eventually(
            lambda: feed.last_seq == pub.next_seq - 1,
            f"{BURST} batches applied under a busy loop",
            DEADLINE_S,
            interval=0.01,
        )
        took = time.monotonic() - burst
        last = [10 * (BURST - 1) + 1, 10 * (BURST - 1) + 2]
        assert index.match(last, PAGE)[url] == (2 * PAGE, 2 * PAGE)
        assert feed.state().resets == 0, "no batch was lost on the way"
        print(f"{BURST} batches applied {took:.2f} s after the burst")
    finally:
        if busy is not None:
            busy.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await busy
        await feed.stop()
