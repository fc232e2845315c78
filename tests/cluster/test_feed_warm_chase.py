"""The warm-up replay after a (re)connect hands over to the live stream.

The feed warmed an empty view by replaying from seq 0 until a round brought nothing new. A
worker restarted under load publishes faster than a busy router reads a replay (one batch per
event-loop turn), so every round brought new batches and the warm-up chased the publisher's
head for up to `replay_rounds` rounds, minutes, while the SUB socket, unread, queued every live
batch in libzmq's native memory: router RSS +250 MB in a soak with a worker killed every 30 s,
the Python heap flat. Here a worker with some history keeps publishing (a batch per ms, from a
thread) while a hog makes each loop turn cost 5 ms: the feed must be reading the live stream
within seconds, and be exact once the worker goes quiet.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator

import pytest

from smetric_router.cluster.kv_index import KvIndex
from smetric_router.cluster.subscriber import KvEventFeed
from smetric_router.emulator.kv_publisher import KvEventPublisher
from tests.cluster.test_feed_backlog import PAGE, hog, serving_worker
from tests.helpers.kv_events import stored
from tests.helpers.polling import eventually

HISTORY = 300  # batches the worker published before the feed connects
EVERY_S = 0.001  # the worker's publishing interval under load
LIVE_DEADLINE_S = 4.0  # the chasing warm-up read no live batch for >= 10 s here


@pytest.fixture
async def worker() -> AsyncIterator[tuple[str, KvEventPublisher]]:
    async with serving_worker(replay=True) as w:
        yield w


def chain(pub: KvEventPublisher, i: int) -> None:
    pub.publish([stored([2 * i + 1, 2 * i + 2], None)])


async def test_warm_up_hands_over_to_a_busy_live_stream(
    worker: tuple[str, KvEventPublisher],
) -> None:
    url, pub = worker
    for i in range(HISTORY):
        chain(pub, i)
    stop = threading.Event()
    published = [HISTORY]

    def publish_steadily() -> None:
        while not stop.is_set():
            chain(pub, published[0])
            published[0] += 1
            time.sleep(EVERY_S)

    thread = threading.Thread(target=publish_steadily, daemon=True)
    index = KvIndex()
    feed = KvEventFeed(url, index)
    busy = asyncio.create_task(hog())
    thread.start()
    feed.start()
    try:
        started = time.monotonic()
        await eventually(lambda: feed.live_seq >= 0, "the feed reads the live stream", 10, 0.01)
        took = time.monotonic() - started
        assert took < LIVE_DEADLINE_S, f"live stream unread for {took:.1f} s (warm-up chasing)"
        stop.set()
        thread.join()
        await eventually(lambda: feed.last_seq == pub.next_seq - 1, "feed caught up", 10)
        last = published[0] - 1
        assert index.match([2 * last + 1, 2 * last + 2], PAGE)[url] == (2 * PAGE, 2 * PAGE)
        assert index.match([1, 2], PAGE)[url] == (2 * PAGE, 2 * PAGE), "history replayed"
        assert feed.state().resets == 0, "nothing was lost on the way"
        print(f"live stream read {took:.2f} s after the start; {published[0]} batches")
    finally:
        stop.set()
        busy.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await busy
        await feed.stop()
