"""Subscribes to each worker's SGLang KV-event stream and keeps the KvIndex in step with it.

Discovery: GET {url}/server_info -> "kv_events" {endpoint_host, endpoint_port_base, topic,
block_size, dp_size[, replay_endpoint_port_base]}; null means events are off.

Sequence handling (never keep stale hits):
- start-up: once the SUB socket connects and a replay socket exists, replay from seq 0 to warm
  the index with whatever the worker still buffers; the first batch seen (replayed or live) is
  accepted as the start;
- a gap (seq > last + 1) is filled from the replay socket; if the replay cannot fill it (buffer
  rolled over, no replay socket, timeout), the worker's index is cleared and the feed continues
  from the new seq;
- the SUB connection dropping (seen through the socket monitor) may be a restarted worker whose
  new seq happens to continue ours: clear, reconnect, and start up again;
- the live stream going backwards means the publisher restarted (a fresh cache): clear too;
- a batch that does not decode (garbage, or a schema other than SGLang 0.5.23's) is a lost batch:
  clear, count it in `decode_errors` and log it (one warning per run of undecodable batches).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from smetric_router.cluster.kv_index import KvIndex
from smetric_router.core.kv_events import decode_batch

log = logging.getLogger(__name__)

_WILDCARD_HOSTS = frozenset({"*", "", "0.0.0.0", "::", "[::]"})
# Live batches applied per wake-up at most, so a flood cannot hold the event loop for long
# (~10 ms of decoding and indexing); the poll that follows finds the rest at once.
_DRAIN_MAX = 256


@dataclass(frozen=True, slots=True)
class FeedConfig:
    replay_timeout_s: float = 2.0  # silence on the replay socket that ends a replay
    warm_start: bool = True
    http_timeout_s: float = 5.0
    retry_max_s: float = 5.0  # backoff cap while /server_info is unreachable
    rcvhwm: int = 100000  # like SGLang's publisher hwm: a burst must not be dropped here


@dataclass(frozen=True, slots=True)
class FeedState:
    """events_enabled: None until /server_info answered. connected: sockets are connected (ZMQ
    reconnects by itself, so this stays true while the worker is away)."""

    url: str
    events_enabled: bool | None
    connected: bool
    last_seq: int
    batches_applied: int
    gaps_recovered: int
    resets: int
    decode_errors: int
    block_size: int | None


@dataclass(frozen=True, slots=True)
class _Endpoints:
    pub: str
    replay: str | None
    topic: bytes
    block_size: int | None
    ipv6: bool


def _endpoints(url: str, kv: dict[str, Any]) -> _Endpoints:
    host = str(kv.get("endpoint_host") or "*")
    url_host = urlsplit(url).hostname or "127.0.0.1"
    if host in _WILDCARD_HOSTS:
        host = url_host
    host = host.strip("[]")
    ipv6 = ":" in host
    tcp_host = f"[{host}]" if ipv6 else host
    replay_port = kv.get("replay_endpoint_port_base")
    block_size = kv.get("block_size")
    return _Endpoints(
        pub=f"tcp://{tcp_host}:{int(kv['endpoint_port_base'])}",
        replay=None if replay_port is None else f"tcp://{tcp_host}:{int(replay_port)}",
        topic=str(kv.get("topic") or "").encode(),
        block_size=None if block_size is None else int(block_size),
        ipv6=ipv6,
    )


class KvEventFeed:
    """One worker's KV-event stream applied to `index` under the worker's URL."""

    def __init__(
        self,
        url: str,
        index: KvIndex,
        *,
        session: aiohttp.ClientSession | None = None,
        config: FeedConfig = FeedConfig(),
    ) -> None:
        self.url = url.rstrip("/")
        self._index = index
        self._session = session
        self._config = config
        self._ctx = zmq.asyncio.Context.instance()
        self._task: asyncio.Task[None] | None = None
        self._sub: zmq.asyncio.Socket | None = None
        self._mon: zmq.asyncio.Socket | None = None
        self._dealer: zmq.asyncio.Socket | None = None
        self._ep: _Endpoints | None = None
        self.events_enabled: bool | None = None
        self.connected = False
        self.last_seq = -1
        self.batches_applied = 0
        self.gaps_recovered = 0
        self.resets = 0
        self.decode_errors = 0
        self._undecodable_run = False  # the last batch applied did not decode
        self._sub_last = -1

    @property
    def live_seq(self) -> int:
        """The last seq seen on the live stream (-1 before the first): the SUB socket has joined."""
        return self._sub_last

    def state(self) -> FeedState:
        return FeedState(
            url=self.url,
            events_enabled=self.events_enabled,
            connected=self.connected,
            last_seq=self.last_seq,
            batches_applied=self.batches_applied,
            gaps_recovered=self.gaps_recovered,
            resets=self.resets,
            decode_errors=self.decode_errors,
            block_size=None if self._ep is None else self._ep.block_size,
        )

    def start(self) -> None:
        if self._task is None:
            self._index.add_worker(self.url)
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"kv-feed {self.url}"
            )

    async def stop(self) -> None:
        """Stop following the worker; its index is cleared, since it would only go stale."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._close_sockets()
        self._index.clear(self.url)

    # -- the task ---------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                await self._follow()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("KV-event feed for %s failed; clearing its view, retrying", self.url)
                self._reset()
            finally:
                self._close_sockets()
            await asyncio.sleep(self._config.retry_max_s)

    async def _follow(self) -> None:
        kv = await self._discover()
        if not kv:
            self.events_enabled = False
            log.warning("%s publishes no KV events; its cache view stays empty", self.url)
            return
        dp_size = int(kv.get("dp_size") or 1)
        if dp_size != 1:
            # Each DP rank has its own cache and SGLang picks the rank, so a hit on one rank is
            # no hit for the URL: reporting none is the safe side.
            self.events_enabled = False
            log.warning("%s has dp_size=%d; its KV events are not indexed", self.url, dp_size)
            return
        self._ep = _endpoints(self.url, kv)
        self.events_enabled = True
        while True:
            await self._follow_connection(self._ep)
            # The connection dropped: the worker may have restarted with a fresh cache and a
            # fresh seq that happens to continue ours, so start over from an empty view.
            self._close_sockets()
            self._reset()

    async def _follow_connection(self, ep: _Endpoints) -> None:
        """Apply live batches until the SUB connection drops."""
        sub, mon = self._connect(ep)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(mon, zmq.POLLIN)
        while True:
            ready = dict(await poller.poll())
            if mon in ready:
                event = parse_monitor_message(await mon.recv_multipart())["event"]
                if event == zmq.EVENT_DISCONNECTED:
                    log.warning("%s: KV-event stream disconnected", self.url)
                    return
                if event == zmq.EVENT_CONNECTED:
                    self.connected = True
                    if self.last_seq < 0 and self._config.warm_start and ep.replay is not None:
                        await self._replay_from(0)
            if sub in ready:
                await self._drain_live(sub)

    async def _drain_live(self, sub: zmq.asyncio.Socket) -> None:
        """Apply what the SUB socket holds, up to _DRAIN_MAX batches, without waiting.

        One batch per poll wake-up was slower than a busy router's workers publish (each wake-up
        costs event-loop turns shared with every HTTP handler): the backlog queued in libzmq's
        native memory (up to `rcvhwm` batches; RSS grew ~9 MB per 1K requests) and the view fell
        behind the workers' caches (after 10K requests it lacked 60 % of their pages)."""
        for _ in range(_DRAIN_MAX):
            try:
                frames = await sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 3 or len(frames[1]) != 8:
                log.warning("%s: malformed KV-event message (%d frames)", self.url, len(frames))
                continue
            await self._on_live(int.from_bytes(frames[1], "big"), frames[2])

    async def _discover(self) -> dict[str, Any] | None:
        own = self._session is None
        session = self._session or aiohttp.ClientSession()
        timeout = aiohttp.ClientTimeout(total=self._config.http_timeout_s)
        delay = 0.1
        try:
            while True:
                for path in ("/server_info", "/get_server_info"):
                    try:
                        async with session.get(self.url + path, timeout=timeout) as resp:
                            if resp.status == 404:
                                continue
                            resp.raise_for_status()
                            info = await resp.json()
                            kv = info.get("kv_events") if isinstance(info, dict) else None
                            return kv if isinstance(kv, dict) else None
                    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                        log.debug("%s%s not reachable yet: %s", self.url, path, e)
                        break
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._config.retry_max_s)
        finally:
            if own:
                await session.close()

    def _connect(self, ep: _Endpoints) -> tuple[zmq.asyncio.Socket, zmq.asyncio.Socket]:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, self._config.rcvhwm)
        sub.setsockopt(zmq.LINGER, 0)
        if ep.ipv6:
            sub.setsockopt(zmq.IPV6, 1)
        sub.setsockopt(zmq.SUBSCRIBE, ep.topic)
        mon = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        sub.connect(ep.pub)
        self._sub, self._mon = sub, mon
        self._sub_last = -1
        return sub, mon

    def _new_dealer(self) -> zmq.asyncio.Socket:
        assert self._ep is not None and self._ep.replay is not None
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        if self._ep.ipv6:
            dealer.setsockopt(zmq.IPV6, 1)
        dealer.connect(self._ep.replay)
        return dealer

    def _close_sockets(self) -> None:
        if self._sub is not None:
            self._sub.disable_monitor()
        for sock in (self._mon, self._sub, self._dealer):
            if sock is not None:
                sock.close(linger=0)
        self._sub = self._mon = self._dealer = None
        self.connected = False

    # -- sequence logic ---------------------------------------------------------------------

    async def _on_live(self, seq: int, payload: bytes) -> None:
        if seq <= self._sub_last:
            log.warning(
                "%s: KV-event seq went back %d -> %d (restart)", self.url, self._sub_last, seq
            )
            self._reset()
        self._sub_last = seq
        if self.last_seq >= 0 and seq > self.last_seq + 1:
            if await self._replay_from(self.last_seq + 1) and self.last_seq >= seq - 1:
                self.gaps_recovered += 1
            else:
                log.warning("%s: KV events %d..%d lost", self.url, self.last_seq + 1, seq - 1)
                self._reset()
        if self.last_seq < 0 or seq == self.last_seq + 1:
            self._apply(seq, payload)
        # else: seq <= last_seq, already applied from a replay

    async def _replay_from(self, start: int) -> bool:
        """Apply buffered batches from `start` on while they continue the sequence. False if the
        replay could not be had or does not continue from last_seq."""
        if self._ep is None or self._ep.replay is None:
            return False
        if self._dealer is None:
            self._dealer = self._new_dealer()
        dealer = self._dealer
        await dealer.send_multipart([b"", start.to_bytes(8, "big")])
        timeout_ms = int(self._config.replay_timeout_s * 1000)
        contiguous = True
        while True:
            if not await dealer.poll(timeout_ms):
                # A late answer to this request must not be read as the answer to the next one.
                dealer.close(linger=0)
                self._dealer = None
                log.warning("%s: KV-event replay from %d timed out", self.url, start)
                return False
            frames = await dealer.recv_multipart()
            if frames and frames[0] == b"":
                frames = frames[1:]
            if len(frames) == 3:
                seq_b, payload = frames[1], frames[2]
            elif len(frames) == 2:
                seq_b, payload = frames
            else:
                continue
            seq = int.from_bytes(seq_b, "big", signed=True)
            if seq == -1:
                return contiguous
            if not contiguous or seq <= self.last_seq:
                continue
            if self.last_seq < 0 or seq == self.last_seq + 1:
                self._apply(seq, payload)
            else:
                contiguous = False  # the buffer no longer holds what we missed

    def _apply(self, seq: int, payload: bytes) -> None:
        self.last_seq = seq
        try:
            batch = decode_batch(payload)
        except msgspec.DecodeError as e:  # ValidationError (a foreign schema) is one too
            # What this batch changed is unknown, so this worker's view starts over.
            self._index.clear(self.url)
            self.resets += 1
            self.decode_errors += 1
            level = logging.DEBUG if self._undecodable_run else logging.WARNING
            self._undecodable_run = True
            log.log(
                level,
                "%s: KV-event batch %d (%d B) is not SGLang 0.5.23's schema (%s); "
                "its cache view is cleared",
                self.url,
                seq,
                len(payload),
                e,
            )
            return
        self._undecodable_run = False
        self._index.apply(self.url, batch)
        self.batches_applied += 1

    def _reset(self) -> None:
        self._index.clear(self.url)
        self.resets += 1
        self.last_seq = -1


class KvEventHub:
    """KV-event feeds for a changing set of workers, all applied to one KvIndex."""

    def __init__(
        self,
        index: KvIndex,
        *,
        session: aiohttp.ClientSession | None = None,
        config: FeedConfig = FeedConfig(),
    ) -> None:
        self.index = index
        self._session = session
        self._config = config
        self._feeds: dict[str, KvEventFeed] = {}

    async def add_worker(self, url: str) -> None:
        url = url.rstrip("/")
        if url in self._feeds:
            return
        feed = KvEventFeed(url, self.index, session=self._session, config=self._config)
        self._feeds[url] = feed
        feed.start()

    async def remove_worker(self, url: str) -> None:
        url = url.rstrip("/")
        feed = self._feeds.pop(url, None)
        if feed is not None:
            await feed.stop()
        self.index.remove_worker(url)

    def stats(self, url: str) -> FeedState | None:
        feed = self._feeds.get(url.rstrip("/"))
        return None if feed is None else feed.state()

    def workers(self) -> list[str]:
        return list(self._feeds)

    async def stop(self) -> None:
        for url in list(self._feeds):
            await self.remove_worker(url)
