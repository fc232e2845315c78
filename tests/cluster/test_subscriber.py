from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from smetric_router.cluster.kv_index import KvIndex
from smetric_router.cluster.subscriber import FeedConfig, KvEventFeed, KvEventHub
from smetric_router.core.kv_events import (
    CPU_PINNED,
    GPU,
    AllBlocksCleared,
    BlockRemoved,
)
from smetric_router.emulator.kv_publisher import KvEventPublisher
from tests.helpers.kv_events import stored
from tests.helpers.polling import eventually

PAGE = 16
CONFIG = FeedConfig(replay_timeout_s=0.5, retry_max_s=0.2)


def port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def kv_descriptor(pub: KvEventPublisher, topic: str = "") -> dict[str, Any]:
    kv: dict[str, Any] = {
        "publisher": "zmq",
        "endpoint_host": "*",
        "endpoint_port_base": port(pub.endpoint),
        "topic": topic,
        "block_size": PAGE,
        "dp_size": 1,
    }
    if pub.replay_endpoint is not None:
        kv["replay_endpoint_port_base"] = port(pub.replay_endpoint)
    return kv


class Worker:
    """A publisher plus a /server_info stub describing it."""

    def __init__(self, pub: KvEventPublisher | None, kv: dict[str, Any] | None) -> None:
        self.pub = pub
        self.kv = kv
        app = web.Application()
        app.router.add_get("/server_info", self._info)
        self.server = TestServer(app, host="127.0.0.1")

    async def _info(self, _: web.Request) -> web.Response:
        return web.json_response({"page_size": PAGE, "kv_events": self.kv})

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"


@pytest.fixture
async def make_worker() -> AsyncIterator[Callable[..., Any]]:
    made: list[Worker] = []

    async def make(replay: bool = True, events: bool = True, topic: str = "kv") -> Worker:
        pub = None
        kv = None
        if events:
            pub = KvEventPublisher(
                "tcp://127.0.0.1:*", "tcp://127.0.0.1:*" if replay else None, topic=topic
            )
            kv = kv_descriptor(pub, topic)
        w = Worker(pub, kv)
        await w.server.start_server()
        made.append(w)
        return w

    yield make
    for w in made:
        await w.server.close()
        if w.pub is not None:
            w.pub.close()


def hits(index: KvIndex, url: str, hashes: list[int]) -> tuple[int, int]:
    return index.match(hashes, PAGE).get(url, (0, 0))


async def following(feed: KvEventFeed, pub: KvEventPublisher, index: KvIndex) -> None:
    """Publish a harmless root page until the live stream (not only the replay) delivers it."""
    deadline = time.monotonic() + 5
    while feed.last_seq < 0 or feed.last_seq < pub.next_seq - 1 or feed.live_seq < 0:
        assert time.monotonic() < deadline, "feed never joined the live stream"
        pub.publish([stored([-1], None)])
        await asyncio.sleep(0.02)
    await eventually(lambda: feed.last_seq == pub.next_seq - 1, "feed caught up")


async def test_end_to_end_warm_start_live_events_and_tiers(
    make_worker: Callable[..., Any],
) -> None:
    w = await make_worker()
    pub: KvEventPublisher = w.pub
    pub.publish([stored([1, 2], None)])  # before the feed exists: reached through the replay
    index = KvIndex()
    feed = KvEventFeed(w.url, index, config=CONFIG)
    assert not feed.state().warmed
    feed.start()
    try:
        # warmed (what readiness waits for) only once the buffered pages are in the view
        await eventually(lambda: feed.state().warmed, "warm start")
        assert hits(index, w.url, [1, 2, 3]) == (2 * PAGE, 2 * PAGE)
        assert feed.events_enabled and feed.connected and feed.state().block_size == PAGE
        await following(feed, pub, index)
        pub.publish([stored([3], 2, CPU_PINNED)])
        await eventually(lambda: hits(index, w.url, [1, 2, 3]) == (2 * PAGE, 3 * PAGE), "host page")
        pub.publish([BlockRemoved(block_hashes=[2], medium=GPU)])
        await eventually(lambda: hits(index, w.url, [1, 2, 3]) == (PAGE, PAGE), "GPU removal")
        pub.publish([AllBlocksCleared()])
        await eventually(lambda: hits(index, w.url, [1]) == (0, 0), "all cleared")
        s = feed.state()
        assert (s.gaps_recovered, s.resets) == (0, 0)
        assert s.last_seq == pub.next_seq - 1 and s.batches_applied == pub.next_seq
    finally:
        await feed.stop()
    assert feed.connected is False


async def test_gap_is_recovered_through_replay(make_worker: Callable[..., Any]) -> None:
    w = await make_worker()
    pub: KvEventPublisher = w.pub
    index = KvIndex()
    feed = KvEventFeed(w.url, index, config=CONFIG)
    feed.start()
    try:
        await following(feed, pub, index)
        pub.drop_seq(pub.next_seq)  # lost on the PUB socket, still in the replay buffer
        pub.publish([stored([10], None)])
        pub.publish([stored([11], 10)])
        await eventually(lambda: hits(index, w.url, [10, 11]) == (2 * PAGE, 2 * PAGE), "recovered")
        assert (feed.gaps_recovered, feed.resets) == (1, 0)
    finally:
        await feed.stop()


async def test_unrecoverable_gap_clears_the_worker(make_worker: Callable[..., Any]) -> None:
    w = await make_worker()
    pub: KvEventPublisher = w.pub
    index = KvIndex()
    feed = KvEventFeed(w.url, index, config=CONFIG)
    feed.start()
    try:
        await following(feed, pub, index)
        pub.publish([stored([1, 2, 3], None)])
        await eventually(lambda: hits(index, w.url, [1, 2, 3])[0] == 3 * PAGE, "stored")
        pub.drop_seq(pub.next_seq, replayable=False)
        pub.publish([BlockRemoved(block_hashes=[3], medium=GPU)])  # lost for good
        pub.publish([stored([20], None)])
        await eventually(lambda: hits(index, w.url, [20]) == (PAGE, PAGE), "continues after gap")
        # the worker no longer holds page 3; keeping [1, 2, 3] would be a stale hit
        assert hits(index, w.url, [1, 2, 3]) == (0, 0)
        assert (feed.gaps_recovered, feed.resets) == (0, 1)
    finally:
        await feed.stop()


async def test_gap_without_replay_socket_clears_the_worker(
    make_worker: Callable[..., Any],
) -> None:
    w = await make_worker(replay=False)
    pub: KvEventPublisher = w.pub
    index = KvIndex()
    feed = KvEventFeed(w.url, index, config=CONFIG)
    feed.start()
    try:
        await following(feed, pub, index)
        pub.publish([stored([1, 2], None)])
        await eventually(lambda: hits(index, w.url, [1, 2])[0] == 2 * PAGE, "stored")
        pub.drop_seq(pub.next_seq)
        pub.publish([BlockRemoved(block_hashes=[2], medium=GPU)])
        pub.publish([stored([30], None)])
        await eventually(lambda: hits(index, w.url, [30])[0] == PAGE, "continues after gap")
        assert hits(index, w.url, [1, 2]) == (0, 0)
        assert feed.resets == 1
    finally:
        await feed.stop()


async def test_publisher_restart_clears_the_worker(make_worker: Callable[..., Any]) -> None:
    w = await make_worker(replay=False)
    old: KvEventPublisher = w.pub
    index = KvIndex()
    feed = KvEventFeed(w.url, index, config=CONFIG)
    feed.start()
    new: KvEventPublisher | None = None
    try:
        await following(feed, old, index)
        old.publish([stored([1], None)])
        await eventually(lambda: hits(index, w.url, [1])[0] == PAGE, "stored")
        for _ in range(5):
            old.publish([stored([-1], None)])  # the new publisher's seq 0 lies well behind
        await eventually(lambda: feed.last_seq == old.next_seq - 1, "caught up")
        endpoint = old.endpoint
        old.close()
        new = KvEventPublisher(endpoint, topic="kv")
        deadline = time.monotonic() + 5
        while hits(index, w.url, [5])[0] == 0:
            assert time.monotonic() < deadline, "never reconnected"
            new.publish([stored([5], None)])
            await asyncio.sleep(0.02)
        assert hits(index, w.url, [1]) == (0, 0)
        assert feed.resets == 1
    finally:
        await feed.stop()
        if new is not None:
            new.close()


async def test_events_off_leaves_worker_empty(
    make_worker: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    w = await make_worker(events=False)
    index = KvIndex()
    feed = KvEventFeed(w.url, index, config=CONFIG)
    with caplog.at_level(logging.WARNING):
        feed.start()
        await eventually(lambda: feed.events_enabled is False, "server_info read")
    assert "publishes no KV events" in caplog.text
    assert index.match([1], PAGE) == {w.url: (0, 0)}
    assert not feed.connected
    await feed.stop()


async def test_hub_adds_and_removes_workers(make_worker: Callable[..., Any]) -> None:
    a = await make_worker(topic="")
    b = await make_worker(topic="")
    index = KvIndex()
    hub = KvEventHub(index, config=CONFIG)
    a.pub.publish([stored([1, 2], None)])
    b.pub.publish([stored([1], None)])
    await hub.add_worker(a.url)
    await hub.add_worker(b.url + "/")
    try:
        await eventually(
            lambda: index.match([1, 2], PAGE) == {a.url: (2 * PAGE,) * 2, b.url: (PAGE,) * 2},
            "both workers indexed",
        )
        assert set(hub.workers()) == {a.url, b.url}
        state = hub.stats(b.url)
        assert state is not None and state.connected and state.last_seq == 0
        await hub.remove_worker(a.url)
        assert index.match([1, 2], PAGE) == {b.url: (PAGE, PAGE)}
        assert hub.stats(a.url) is None
    finally:
        await hub.stop()
    assert index.workers() == []
