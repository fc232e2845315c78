"""Subscribes to each worker's SGLang KV-event stream and keeps the KvIndex in step with it.

Discovery: GET {url}/server_info -> "kv_events" {endpoint_host, endpoint_port_base, topic,
block_size, dp_size[, replay_endpoint_port_base]}; null means events are off. A wildcard host
(*, 0.0.0.0, ::) means the worker's own host; any other host than the worker's own is refused
unless `trust_endpoints` (--trust-kv-endpoints): a worker must not point the router elsewhere.

Replay (SGLang 0.5.23's ROUTER socket, and the emulator's, which copies it): a request names a
start seq only; the publisher answers every buffered batch from there in one burst, then an end
marker (seq -1). Its ROUTER keeps ZMQ's default send HWM (1,000 messages) and drops what does
not fit, end marker included, silently: a large replay arrives with holes or cut short. So a
replay here is a series of rounds, each on a fresh DEALER (so nothing late of an earlier round is
read as an answer): a round is read until the end marker, a hole in the sequence, the seq it
needed, or `replay_timeout_s` of silence; the next round asks again from the first missing seq.
It succeeds when the sequence reaches what was needed without a hole, and fails when the buffer
no longer holds the first seq asked for (rolled over) or `replay_rounds` rounds bring nothing.

Sequence handling (never keep stale hits):
- start-up: once the SUB socket's handshake completes and a replay socket exists, replay from
  seq 0 to warm the index with whatever the worker still buffers, until the buffer's end or until
  the SUB socket holds live batches (then the live stream takes over: a replay never chases a busy
  worker's head while live batches queue unread); the first batch seen (replayed or live) is
  accepted as the start. A start after seq 0 is a partial history: pages announced
  before it are never announced again, so the index accepts stores under unknown parents
  (KvIndex.set_partial);
- a gap (seq > last + 1) is filled by a replay; if that fails, the worker's index is cleared and
  warmed again from the whole buffer (a partial history), then the feed continues;
- the SUB connection dropping may be a restarted worker whose new seq happens to continue ours:
  clear, re-read /server_info (the worker may be back on other ports), reconnect with
  exponential backoff and jitter, and start up again;
- silence: ZMQ heartbeats (ZMTP PING/PONG, answered by the publisher's libzmq itself, which
  SGLang's publisher does not configure but answers) drop a connection whose peer stops
  answering, e.g. behind a frozen proxy. SGLang's publisher sends nothing periodic, so after
  `idle_probe_s` without a live batch the feed asks the replay socket for what follows its last
  seq: an answer with batches the SUB socket never delivered, or no answer at all, is a stall:
  the index is cleared (hits 0: nothing is routed on a view we cannot vouch for) and re-synced
  on a fresh connection;
- the live stream going backwards means the publisher restarted (a fresh cache): clear too;
- a batch that does not decode (garbage, or a schema other than SGLang 0.5.23's) is a lost batch:
  clear, count it in `decode_errors` and log it (one warning per run of undecodable batches).

Logging follows the feed's state (up / down), one line per change; retries in between are debug.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import random
import time
from dataclasses import dataclass, field
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
    replay_timeout_s: float = 2.0  # silence on the replay socket that ends a replay round
    replay_rounds: int = 50  # rounds one replay may take (each asks from the first missing seq)
    warm_start: bool = True
    http_timeout_s: float = 5.0
    retry_min_s: float = 0.1  # first reconnect / rediscovery delay; doubles per failure
    retry_max_s: float = 5.0  # backoff cap
    rcvhwm: int = 100000  # like SGLang's publisher hwm: a burst must not be dropped here
    heartbeat_ivl_s: float = 1.0  # ZMQ PING interval on the SUB connection
    heartbeat_timeout_s: float = 3.0  # no traffic this long after a PING: connection dropped
    connect_timeout_s: float = 10.0  # no handshake this long: re-read /server_info, reconnect
    idle_probe_s: float = 5.0  # no live batch this long: check the feed against the replay
    stable_s: float = 10.0  # a connection up this long resets the backoff
    trust_endpoints: bool = False  # accept a KV-event host other than the worker's own
    # sent with /server_info: the worker key (SGLang's --api-key guards it), if any
    http_headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)


@dataclass(frozen=True, slots=True)
class FeedState:
    """events_enabled: None until /server_info answered. connected: the SUB socket's handshake
    with the publisher completed and the connection has not dropped since."""

    url: str
    events_enabled: bool | None
    connected: bool
    last_seq: int
    batches_applied: int
    gaps_recovered: int
    resets: int
    decode_errors: int
    block_size: int | None
    stalls: int = 0
    reconnects: int = 0
    refused: bool = False
    # the first connection's warm start is done: the view holds what the worker still buffered
    warmed: bool = False


@dataclass(frozen=True, slots=True)
class _Endpoints:
    pub: str
    replay: str | None
    topic: bytes
    block_size: int | None
    ipv6: bool
    host: str
    own_host: bool  # the worker's own host (or a wildcard meaning it)


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _same_host(a: str, b: str) -> bool:
    a, b = a.strip("[]").lower(), b.strip("[]").lower()
    return a == b or (_is_loopback(a) and _is_loopback(b))


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
        host=host,
        own_host=_same_host(host, url_host),
    )


class _Backoff:
    """Exponential backoff with full jitter over [min, cap]: spreads the retries of many
    routers and workers, and bounds a failing feed to a few attempts per `cap` seconds."""

    def __init__(self, lo: float, hi: float) -> None:
        self._lo, self._hi = lo, max(lo, hi)
        self.failures = 0

    def next(self) -> float:
        ceiling = min(self._hi, self._lo * 2 ** min(self.failures, 30))
        self.failures += 1
        return random.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.failures = 0


class _Stalled(Exception):
    """The feed cannot be vouched for: drop the connection and the index, re-sync."""


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
        self.refused = False
        self.warmed = False
        self.last_seq = -1
        self.batches_applied = 0
        self.gaps_recovered = 0
        self.resets = 0
        self.decode_errors = 0
        self.stalls = 0
        self.reconnects = 0  # connections that failed or dropped
        self._undecodable_run = False  # the last batch applied did not decode
        self._sub_last = -1
        self._replay_silent = False  # the last replay failed for want of any answer
        self._down_logged = False  # the current outage has been logged
        self._backoff = _Backoff(config.retry_min_s, config.retry_max_s)

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
            stalls=self.stalls,
            reconnects=self.reconnects,
            refused=self.refused,
            warmed=self.warmed,
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
            await asyncio.sleep(self._backoff.next())

    async def _follow(self) -> None:
        while True:
            kv = await self._discover()
            if not kv:
                self.events_enabled = False
                log.warning("%s publishes no KV events; its cache view stays empty", self.url)
                return
            dp_size = int(kv.get("dp_size") or 1)
            if dp_size != 1:
                # Each DP rank has its own cache and SGLang picks the rank, so a hit on one rank
                # is no hit for the URL: reporting none is the safe side.
                self.events_enabled = False
                log.warning("%s has dp_size=%d; its KV events are not indexed", self.url, dp_size)
                return
            ep = _endpoints(self.url, kv)
            if not ep.own_host and not self._config.trust_endpoints:
                self.events_enabled = False
                self.refused = True
                log.error(
                    "%s: /server_info names KV-event host %s, not the worker's own host; "
                    "refused (--trust-kv-endpoints accepts it); its cache view stays empty",
                    self.url,
                    ep.host,
                )
                return
            if self._ep is not None and (ep.pub, ep.replay) != (self._ep.pub, self._ep.replay):
                log.info("%s: KV events moved to %s (replay %s)", self.url, ep.pub, ep.replay)
            self._ep = ep
            self.events_enabled = True
            up_since = time.monotonic()
            reason = await self._follow_connection(ep)
            # The connection dropped: the worker may have restarted with a fresh cache and a
            # fresh seq that happens to continue ours, so start over from an empty view.
            self._close_sockets()
            self._reset()
            self.reconnects += 1
            if reason is None and time.monotonic() - up_since >= self._config.stable_s:
                self._backoff.reset()
            self._went_down(
                reason
                or f"connection to {ep.pub} lost: closed, or heartbeats unanswered for "
                f"{self._config.heartbeat_timeout_s:g} s"
            )
            await asyncio.sleep(self._backoff.next())

    def _went_down(self, reason: str) -> None:
        if self._down_logged:
            log.debug("%s: KV-event feed still down (%s)", self.url, reason)
            return
        self._down_logged = True
        log.warning(
            "%s: KV-event feed down (%s); its cache view is empty until it is back; "
            "reconnecting with backoff",
            self.url,
            reason,
        )

    def _went_up(self) -> None:
        if self._down_logged:
            log.info("%s: KV-event feed back up after %d reconnects", self.url, self.reconnects)
        self._down_logged = False

    async def _follow_connection(self, ep: _Endpoints) -> str | None:
        """Apply live batches until the connection drops (None) or fails (the reason)."""
        sub, mon = self._connect(ep)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(mon, zmq.POLLIN)
        up = False
        deadline = time.monotonic() + self._config.connect_timeout_s
        last_live = time.monotonic()
        while True:
            if up:
                wait_s = last_live + self._config.idle_probe_s - time.monotonic()
            else:
                wait_s = deadline - time.monotonic()
            ready = dict(await poller.poll(max(0, int(wait_s * 1000))))
            if not ready:
                if not up:
                    return f"no handshake with {ep.pub} within {self._config.connect_timeout_s:g} s"
                try:
                    await self._probe_idle()
                except _Stalled as e:
                    self.stalls += 1
                    return f"stalled: {e}"
                last_live = time.monotonic()
                continue
            if mon in ready:
                event = parse_monitor_message(await mon.recv_multipart())["event"]
                if event == zmq.EVENT_DISCONNECTED:
                    if not up:
                        return f"{ep.pub} closed the connection during the handshake"
                    return None
                if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    up = self.connected = True
                    last_live = time.monotonic()
                    self._went_up()
                    if self.last_seq < 0:
                        await self._warm()
                    self.warmed = True
            if sub in ready:
                last_live = time.monotonic()
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

    async def _probe_idle(self) -> None:
        """No live batch for a while: an idle worker, or a stream that stopped reaching us.
        Ask the replay socket what follows our last seq."""
        if self._ep is None or self._ep.replay is None:
            return  # nothing to compare with; the heartbeats still watch the connection
        before = self.last_seq
        ok = await self._replay(self.last_seq + 1 if self.last_seq >= 0 else 0, None)
        if self._replay_silent and not ok:
            raise _Stalled("the replay socket does not answer")
        if self.last_seq > before:
            sub = self._sub
            if sub is not None and await sub.poll(int(self._config.heartbeat_timeout_s * 1000)):
                return  # the live stream delivers after all (a batch raced the probe)
            raise _Stalled(
                f"batches {before + 1}..{self.last_seq} never arrived on the live stream"
            )
        if not ok:
            raise _Stalled("the replay does not continue the sequence")

    async def _discover(self) -> dict[str, Any] | None:
        own = self._session is None
        session = self._session or aiohttp.ClientSession()
        timeout = aiohttp.ClientTimeout(total=self._config.http_timeout_s)
        try:
            while True:
                for path in ("/server_info", "/get_server_info"):
                    try:
                        async with session.get(
                            self.url + path, timeout=timeout, headers=self._config.http_headers
                        ) as resp:
                            if resp.status == 404:
                                continue
                            resp.raise_for_status()
                            info = await resp.json()
                            kv = info.get("kv_events") if isinstance(info, dict) else None
                            return kv if isinstance(kv, dict) else None
                    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                        log.debug("%s%s not reachable yet: %s", self.url, path, e)
                        break
                await asyncio.sleep(self._backoff.next())
        finally:
            if own:
                await session.close()

    def _connect(self, ep: _Endpoints) -> tuple[zmq.asyncio.Socket, zmq.asyncio.Socket]:
        cfg = self._config
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, cfg.rcvhwm)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.HEARTBEAT_IVL, int(cfg.heartbeat_ivl_s * 1000))
        sub.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(cfg.heartbeat_timeout_s * 1000))
        sub.setsockopt(zmq.HANDSHAKE_IVL, int(cfg.connect_timeout_s * 1000))
        # ZMQ's own reconnects (while the port refuses) back off too; ours follow a drop
        sub.setsockopt(zmq.RECONNECT_IVL, max(1, int(cfg.retry_min_s * 1000)))
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, int(cfg.retry_max_s * 1000))
        if ep.ipv6:
            sub.setsockopt(zmq.IPV6, 1)
        sub.setsockopt(zmq.SUBSCRIBE, ep.topic)
        mon = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        sub.connect(ep.pub)
        self._sub, self._mon = sub, mon
        self._sub_last = -1
        return sub, mon

    def _new_dealer(self) -> zmq.asyncio.Socket:
        assert self._ep is not None and self._ep.replay is not None
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        # the publisher sends a replay in one burst: do not be the one that drops it
        dealer.setsockopt(zmq.RCVHWM, self._config.rcvhwm)
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
            await self._warm()
        self._sub_last = seq
        if self.last_seq >= 0 and seq > self.last_seq + 1:
            if await self._replay(self.last_seq + 1, seq - 1):
                self.gaps_recovered += 1
            else:
                log.warning(
                    "%s: KV events %d..%d lost; its cache view is rebuilt from the replay buffer",
                    self.url,
                    self.last_seq + 1,
                    seq - 1,
                )
                self._reset()
                await self._warm()
                if self.last_seq >= 0 and seq > self.last_seq + 1:
                    # The warm view handed over to the live stream short of this batch: the same
                    # hole lies between them, and bridging it again would reset on every batch.
                    # The view starts here instead (a partial history).
                    self._index.clear(self.url)
                    self.last_seq = -1
        if self.last_seq < 0 or seq == self.last_seq + 1:
            self._apply(seq, payload)
        # else: seq <= last_seq, already applied from a replay

    async def _warm(self) -> None:
        """Fill an empty view from whatever the worker still buffers."""
        if self._config.warm_start and self.last_seq < 0 and not await self._replay(0, None):
            # What it applied is a view as of some past seq it cannot bring up to date
            # (lost batches): the live stream starts a fresh one instead.
            self._index.clear(self.url)
            self.last_seq = -1

    async def _replay(self, start: int, until: int | None) -> bool:
        """Apply buffered batches from `start` (or, with an empty view, from the first one
        buffered at or after it) through `until` (None: the end of the buffer, confirmed by an
        end marker that brings nothing new), in rounds (see the module docstring). True when the
        sequence got there without a hole."""
        self._replay_silent = False
        if self._ep is None or self._ep.replay is None:
            return False
        fruitless = 0
        for _ in range(self._config.replay_rounds):
            want = self.last_seq + 1 if self.last_seq >= 0 else start
            before = self.last_seq
            outcome = await self._replay_round(want, until)
            progressed = self.last_seq > before
            if until is not None and self.last_seq >= until:
                return True
            if outcome == "rolled-over":
                log.warning("%s: KV-event replay buffer no longer holds seq %d", self.url, want)
                return False
            if outcome == "end" and not progressed:
                return until is None  # nothing more is buffered
            if progressed:
                fruitless = 0
                if until is None and self._live_pending():
                    # The live stream holds what follows: it takes over, and a gap up to its
                    # first batch is replayed with a bound. Chasing the head of a busy worker
                    # here never ended (each round brought new batches) while the unread SUB
                    # socket queued every live batch in libzmq's memory (router RSS +250 MB).
                    return True
                continue
            fruitless += 1
            if fruitless >= 2:
                self._replay_silent = outcome == "silent"
                log.warning("%s: KV-event replay from %d: %s twice", self.url, want, outcome)
                return False
        log.warning("%s: KV-event replay from %d took too many rounds", self.url, start)
        return False

    async def _replay_round(self, want: int, until: int | None) -> str:
        """One request on a fresh DEALER, read until: `until` applied ("done"), the end marker
        ("end"), a hole ("hole"), silence ("silent"), or an answer that starts after `want` while
        the view needs `want` ("rolled-over")."""
        self._dealer = dealer = self._new_dealer()
        timeout_ms = int(self._config.replay_timeout_s * 1000)
        first = True
        read = 0
        try:
            await dealer.send_multipart([b"", want.to_bytes(8, "big")])
            while True:
                # Like _drain_live: what the socket holds is read without waiting (a wait per
                # batch costs loop turns, and a busy router then replays slower than a worker
                # publishes), yielding to the loop every _DRAIN_MAX batches.
                try:
                    frames = await dealer.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    if not await dealer.poll(timeout_ms):
                        return "silent"
                    continue
                read += 1
                if read % _DRAIN_MAX == 0:
                    await asyncio.sleep(0)
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
                    return "end"
                if first and self.last_seq >= 0 and seq > want:
                    return "rolled-over"
                first = False
                if self.last_seq >= 0 and seq <= self.last_seq:
                    continue
                if self.last_seq >= 0 and seq != self.last_seq + 1:
                    return "hole"  # dropped by the publisher's send HWM: ask again from here
                self._apply(seq, payload)
                if until is not None and seq >= until:
                    return "done"
        finally:
            # what is still on its way for this DEALER dies with it
            dealer.close(linger=0)
            self._dealer = None

    def _live_pending(self) -> bool:
        events = self._sub.get(zmq.EVENTS) if self._sub is not None else 0
        return isinstance(events, int) and bool(events & zmq.POLLIN)

    def _apply(self, seq: int, payload: bytes) -> None:
        if self.last_seq < 0:
            # the start of this view: after seq 0 the worker may hold pages announced earlier
            self._index.set_partial(self.url, seq != 0)
        self.last_seq = seq
        try:
            batch = decode_batch(payload)
        except msgspec.DecodeError as e:  # ValidationError (a foreign schema) is one too
            # What this batch changed is unknown, so this worker's view starts over.
            self._index.clear(self.url)
            self._index.set_partial(self.url, True)
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
