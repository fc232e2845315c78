"""The KV-event feed under failure: large truncated replays, a stalled stream, a worker back on
new ports, a port that accepts and closes, a foreign KV-event host."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

from smetric_router.cluster.kv_index import KvIndex
from smetric_router.cluster.subscriber import FeedConfig, KvEventFeed, KvEventHub
from smetric_router.core.kv_events import AllBlocksCleared
from smetric_router.emulator.kv_events import encode_batch
from smetric_router.emulator.kv_publisher import END_SEQ, KvEventPublisher
from smetric_router.router.assemble import make_state
from smetric_router.router.cli import config_from_args
from tests.cluster.frozen_proxy import FrozenProxy
from tests.cluster.test_subscriber import (
    PAGE,
    Worker,
    following,
    hits,
    kv_descriptor,
    make_worker,
    port,
)
from tests.helpers.kv_events import stored
from tests.helpers.polling import eventually

__all__ = ["make_worker"]  # the fixture, imported for pytest

FAST = FeedConfig(
    replay_timeout_s=0.5,
    retry_min_s=0.05,
    retry_max_s=0.5,
    heartbeat_ivl_s=0.3,
    heartbeat_timeout_s=1.0,
    connect_timeout_s=2.0,
    idle_probe_s=1.0,
)


class LossyReplay:
    """A replay ROUTER that answers like a publisher whose send HWM overflows: of each answer
    only the first `burst` batches get through, the rest and the end marker are dropped."""

    def __init__(self, payloads: list[bytes], first_seq: int, burst: int) -> None:
        self._payloads = payloads
        self._first = first_seq
        self._burst = burst
        self.starts: list[int] = []
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind("tcp://127.0.0.1:*")
        self.port = port(self._sock.getsockopt_string(zmq.LAST_ENDPOINT))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._sock.poll(50):
                continue
            ident, _, start_b = self._sock.recv_multipart()
            start = int.from_bytes(start_b, "big")
            self.starts.append(start)
            sent = 0
            for i, payload in enumerate(self._payloads):
                seq = self._first + i
                if seq < start:
                    continue
                if sent == self._burst:
                    break  # dropped, end marker included
                self._sock.send_multipart((ident, b"", b"kv", seq.to_bytes(8, "big"), payload))
                sent += 1
            else:
                self._sock.send_multipart((ident, b"", b"", END_SEQ, b""))

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close(0)
        self._ctx.term()


async def test_truncated_replay_bursts_are_asked_again_until_complete(
    make_worker: Callable[..., Any],
) -> None:
    """3,000 buffered batches answered 250 at a time with no end marker: the warm start asks
    again from the first missing seq until it has them all, then confirms the end."""
    n, burst = 3000, 250
    payloads = [encode_batch([stored([i + 1], None)], 0.0) for i in range(n)]
    replay = LossyReplay(payloads, 0, burst)
    w: Worker = await make_worker(replay=False)
    assert w.kv is not None
    w.kv["replay_endpoint_port_base"] = replay.port
    index = KvIndex()
    feed = KvEventFeed(w.url, index, config=FAST)
    feed.start()
    try:
        await eventually(lambda: feed.last_seq == n - 1, "whole buffer replayed", timeout=20)
        assert all(hits(index, w.url, [i + 1]) == (PAGE, PAGE) for i in range(0, n, 97))
        assert replay.starts[:3] == [0, burst, 2 * burst]
        assert feed.resets == 0
    finally:
        await feed.stop()
        replay.close()


async def test_warm_start_takes_a_large_emulated_burst_whole(
    make_worker: Callable[..., Any],
) -> None:
    """The emulated publisher, like SGLang's, answers its whole buffer in one burst on a ROUTER
    socket with ZMQ's default HWM; 12,000 batches of ~1 KB must all arrive."""
    w: Worker = await make_worker()
    pub = w.pub
    assert pub is not None
    w.pub = None  # closed here, with its bigger buffer
    pub.close()
    n = 12000
    pub = KvEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", "kv", buffer_steps=n)
    w.kv = kv_descriptor(pub, "kv")
    index = KvIndex()
    feed = KvEventFeed(w.url, index, config=FAST)
    try:
        for i in range(n):
            pub.publish([stored([i + 1], None)])
        await eventually(lambda: len(pub._buffer) == n, "published", timeout=30)
        feed.start()
        await eventually(lambda: feed.last_seq == n - 1, "whole buffer replayed", timeout=30)
        assert hits(index, w.url, [n]) == (PAGE, PAGE)
        assert feed.batches_applied == n and feed.resets == 0
    finally:
        await feed.stop()
        pub.close()


async def test_stalled_stream_behind_a_frozen_proxy_is_dropped_and_resynced(
    make_worker: Callable[..., Any],
) -> None:
    w: Worker = await make_worker()
    pub = w.pub
    assert pub is not None
    assert w.kv is not None
    proxy = FrozenProxy("127.0.0.1", port(pub.endpoint))
    w.kv["endpoint_port_base"] = await proxy.start()
    index = KvIndex()
    feed = KvEventFeed(w.url, index, config=FAST)
    feed.start()
    try:
        await following(feed, pub, index)
        pub.publish([stored([1, 2, 3], None)])
        await eventually(lambda: hits(index, w.url, [1, 2, 3]) == (3 * PAGE, 3 * PAGE), "stored")
        proxy.freeze()
        # the worker's cache is flushed behind the frozen stream
        pub.publish([AllBlocksCleared()])
        t0 = time.monotonic()
        await eventually(lambda: hits(index, w.url, [1, 2, 3]) == (0, 0), "stale view dropped")
        assert time.monotonic() - t0 < 4.0
        await eventually(lambda: feed.stalls + feed.reconnects >= 1, "connection dropped")
    finally:
        await feed.stop()
        await proxy.close()


async def test_idle_probe_notices_batches_the_live_stream_never_delivered(
    make_worker: Callable[..., Any],
) -> None:
    """A connection that stays up (heartbeats answered) but delivers nothing: batches the
    replay socket has and the live stream never brought are a stall."""
    w: Worker = await make_worker()
    pub = w.pub
    assert pub is not None
    index = KvIndex()
    feed = KvEventFeed(w.url, index, config=FAST)
    feed.start()
    try:
        await following(feed, pub, index)
        pub.publish([stored([1, 2], None)])
        await eventually(lambda: hits(index, w.url, [1, 2])[0] == 2 * PAGE, "stored")
        pub.drop_seq(pub.next_seq)  # never sent live; replayable
        pub.publish([AllBlocksCleared(), stored([7], None)])
        await eventually(lambda: feed.stalls == 1, "stall noticed", timeout=6)
        # re-synced from the replay buffer on a fresh connection: the flush is seen
        await eventually(lambda: hits(index, w.url, [7]) == (PAGE, PAGE), "re-synced", timeout=6)
        assert hits(index, w.url, [1, 2]) == (0, 0)
    finally:
        await feed.stop()


async def test_worker_back_on_new_ports_is_rediscovered(make_worker: Callable[..., Any]) -> None:
    w: Worker = await make_worker()
    pub = w.pub
    assert pub is not None
    index = KvIndex()
    feed = KvEventFeed(w.url, index, config=FAST)
    feed.start()
    try:
        await following(feed, pub, index)
        pub.publish([stored([1], None)])
        await eventually(lambda: hits(index, w.url, [1]) == (PAGE, PAGE), "stored")
        pub.close()  # the worker restarts, its KV events on other ports
        w.pub = pub = KvEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", "kv")
        w.kv = kv_descriptor(pub, "kv")
        await eventually(lambda: hits(index, w.url, [1]) == (0, 0), "old view dropped")
        deadline = time.monotonic() + 10
        while hits(index, w.url, [5]) != (PAGE, PAGE):
            assert time.monotonic() < deadline, "new endpoints never followed"
            pub.publish([stored([5], None)])
            await asyncio.sleep(0.1)
        assert feed.state().connected
    finally:
        await feed.stop()


@contextlib.contextmanager
def _accept_and_close_server() -> Iterator[tuple[int, list[int]]]:
    """A port that accepts each connection and closes it at once: (its port, accepted count).
    The thread ends before its socket closes: closed under a waiting accept(), the socket
    would raise in the thread after the test."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(128)
    srv.settimeout(0.05)
    accepted = [0]
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            accepted[0] += 1
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield srv.getsockname()[1], accepted
    finally:
        stop.set()
        thread.join()
        srv.close()


async def test_port_that_accepts_and_closes_is_retried_with_backoff(
    make_worker: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    with _accept_and_close_server() as (port, accepted):
        await _watch_backoff(make_worker, caplog, port, accepted)


async def _watch_backoff(
    make_worker: Callable[..., Any], caplog: pytest.LogCaptureFixture, port: int,
    accepted: list[int],
) -> None:  # fmt: skip
    w: Worker = await make_worker(replay=False)
    assert w.kv is not None
    w.kv["endpoint_port_base"] = port
    feed = KvEventFeed(w.url, KvIndex(), config=FeedConfig(retry_min_s=0.1, retry_max_s=1.0))
    caplog.set_level(logging.DEBUG, logger="smetric_router.cluster.subscriber")
    cpu0 = time.process_time()
    feed.start()
    try:
        await asyncio.sleep(4.0)  # the observation window itself
        cpu = time.process_time() - cpu0
        lines = [
            r for r in caplog.records if r.name == "smetric_router.cluster.subscriber"
            and r.levelno >= logging.INFO
        ]  # fmt: skip
        # backoff 0.1, 0.2, 0.4, 0.8, 1.0...: about ten attempts in 4 s, not thousands
        assert 1 <= accepted[0] < 20, accepted[0]
        assert len(lines) == 1, [r.getMessage() for r in lines]  # one line: the feed is down
        assert cpu < 1.5, cpu  # not spinning
        assert not feed.connected
    finally:
        await feed.stop()


async def test_foreign_kv_event_host_is_refused_unless_trusted(
    make_worker: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    w: Worker = await make_worker()
    assert w.kv is not None
    w.kv["endpoint_host"] = "10.255.255.1"  # not the worker's host (127.0.0.1)
    feed = KvEventFeed(w.url, KvIndex(), config=FAST)
    feed.start()
    try:
        await eventually(lambda: feed.events_enabled is not None, "discovered")
        assert feed.state().refused and feed.events_enabled is False
        assert "refused" in caplog.text and "10.255.255.1" in caplog.text
    finally:
        await feed.stop()
    trusted = KvEventFeed(w.url, KvIndex(), config=FeedConfig(trust_endpoints=True))
    trusted.start()
    try:
        await eventually(lambda: trusted.events_enabled is not None, "discovered")
        assert trusted.events_enabled and not trusted.state().refused
    finally:
        await trusted.stop()


@pytest.mark.parametrize("host", ["*", "0.0.0.0", "127.0.0.1", "localhost"])
async def test_own_or_wildcard_kv_event_host_is_followed(
    make_worker: Callable[..., Any], host: str
) -> None:
    w: Worker = await make_worker()
    assert w.kv is not None
    w.kv["endpoint_host"] = host
    pub = w.pub
    assert pub is not None
    index = KvIndex()
    feed = KvEventFeed(w.url, index, config=FAST)
    feed.start()
    try:
        await following(feed, pub, index)
        assert not feed.state().refused
    finally:
        await feed.stop()


def test_trust_flag_reaches_the_feeds() -> None:
    for argv, trusted in (((), False), (("--trust-kv-endpoints",), True)):
        config = config_from_args(["--worker-urls", "http://127.0.0.1:1", *argv])
        assert config.trust_kv_endpoints is trusted
        hub = make_state(config).kv_feeds
        assert isinstance(hub, KvEventHub) and hub._config.trust_endpoints is trusted
