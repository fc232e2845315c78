"""Router replicas tell each other what they have in flight, so that N routers see load as one.

A replica's own count per worker (Worker.own: requests in flight to a colocated worker, tokens
for a PD instance) is exact and immediate for its own dispatches. Another replica's dispatches
reached it only through the workers' /v1/loads, up to one poll late: in that window a burst of
first turns reads the same worker as least loaded in every replica, and four replicas had a
1.08-1.27x worse TTFT p90 than one router (benchmarks/results/compare-replicas.md).

Each replica publishes a snapshot of its own counts when they change and at least every
`heartbeat_s`: it wakes when the router sends a request or one is answered (the registry's
`counts_changed`), at most once per `send_every_s`, and otherwise every `idle_poll_s` for the
changes nothing wakes it for (a failed attempt, a tenant's spending). Polling every 5 ms instead
kept four idle processes at 11 % of a core. Snapshots, never deltas: a lost or reordered
message is corrected by the next, and a restarted replica (a new id) starts from nothing. A peer
not heard for `expire_s` stops counting; the workers' reports then cover whatever it still has in
flight, as they cover any router that does not sync. The counts enter the load rule beside the
router's own (router/workers.py). A colocated worker's unprefilled tokens (what `smetric-ftwork`
places first turns by) travel the same way, beside its request count. So do the new prompt tokens
each replica has routed to each worker since it started (what `smetric-ftrecent` places first
turns by, summed with a half-life): a total, so that a lost snapshot is folded into the next; a
peer's increments are added to the worker's recent sum as they are heard, charged like spending
(below: all of it from a peer's first snapshot, a baseline from a later one).

The same snapshots carry what each replica's rate limits let through per tenant since it
started (admission/buckets.py: RateLimiter.spent), and each replica charges a peer's increments
to its own buckets, so the tenants' limits and --rate-limit-tokens-per-second hold across the
replicas instead of N times over. A peer first heard at its first snapshot has all it spent
charged; one first heard later (this replica started after it) is a baseline only, as what it
spent before is already paid back in its own buckets or long refilled here.

Wire: ZeroMQ PUB/SUB, one msgpack array per snapshot: [version, replica id, seq, {url: count},
{tenant: [requests, tokens]}, {url: unprefilled tokens}, {url: new prompt tokens routed, ever}].
Fields are only ever appended: a replica reads a shorter array with the missing ones empty and
ignores trailing ones it does not know, so replicas one release apart still share what both
know; `version` changes only when a field's meaning does.
Every replica subscribes to every endpoint it is given, its own included (it skips its own id),
so all replicas can be given the same list. Counts for a URL a replica does not serve are
ignored: a forged message can skew load between configured workers, never route elsewhere.

Invariants: a worker's `peers` (and `unprefilled_peers`) is the sum over fresh peers of their last
snapshot's count for its URL, 0 when none has it; nothing here touches the router's own counts; a
peer's spending is charged here once per increment (snapshots are cumulative, so a lost one is
folded into the next).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import msgspec
import zmq
import zmq.asyncio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from smetric_router.admission.buckets import RateLimiter
from smetric_router.core.tasks import cancel_and_wait
from smetric_router.router.workers import Role, Worker

log = logging.getLogger(__name__)

VERSION = 2  # 2: the tenants' spending


class Snapshot(msgspec.Struct, array_like=True, frozen=True):
    version: int
    replica: str
    seq: int
    counts: dict[str, int]
    spent: dict[str, tuple[float, float]] = {}
    unprefilled: dict[str, int] = {}
    routed: dict[str, int] = {}


@dataclass(frozen=True, slots=True)
class SyncConfig:
    bind: str  # a ZeroMQ endpoint: tcp://host:port or ipc:///path
    peers: tuple[str, ...]
    # A request on the emulated H20 profile waits tens of ms for its first token at best: a
    # peer's dispatch is seen within a fraction of that.
    send_every_s: float = 0.005
    idle_poll_s: float = 0.05
    heartbeat_s: float = 0.25
    expire_s: float = 1.0


@dataclass(slots=True)
class _Peer:
    seq: int
    counts: dict[str, int]
    heard_at: float
    spent: dict[str, tuple[float, float]]
    unprefilled: dict[str, int]
    routed: dict[str, int]


class ReplicaSync:
    """Publishes this replica's counts and folds its peers' into each Worker.peers."""

    def __init__(
        self,
        config: SyncConfig,
        workers: Callable[[], Iterable[Worker]],
        clock: Callable[[], float] = time.monotonic,
        limits: RateLimiter | None = None,
        changed: asyncio.Event | None = None,
    ) -> None:
        self.config = config
        self._limits = limits
        self._changed = changed  # None: poll every send_every_s
        self.replica = os.urandom(8).hex()
        self._workers = workers
        self._clock = clock
        self._peers: dict[str, _Peer] = {}
        self._seq = 0
        self._sent: tuple[object, ...] | None = None
        self._sent_at = 0.0
        self._decoder = msgspec.msgpack.Decoder(Snapshot)
        self._encoder = msgspec.msgpack.Encoder()
        self._pub: zmq.asyncio.Socket | None = None
        self._sub: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.received = 0
        self.malformed = 0

    @property
    def peers(self) -> int:
        """Peers heard within expire_s."""
        return len(self._peers)

    async def start(self) -> None:
        ctx = zmq.asyncio.Context.instance()
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        # a snapshot supersedes the ones before it: a slow peer needs the newest, not a backlog
        pub.setsockopt(zmq.SNDHWM, 16)
        try:
            pub.bind(self.config.bind)
        except zmq.ZMQError as e:
            pub.close()
            raise OSError(f"--replica-sync-bind {self.config.bind}: {e}") from None
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 1024)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        for peer in self.config.peers:
            sub.connect(peer)
        self._pub, self._sub = pub, sub
        self._tasks = [asyncio.create_task(self._send_loop()), asyncio.create_task(self._recv())]
        log.info(
            "replica sync: publishing on %s, listening to %d endpoints (replica %s)",
            self.config.bind,
            len(self.config.peers),
            self.replica,
        )

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks = []
        for s in (self._pub, self._sub):
            if s is not None:
                s.close()
        self._pub = self._sub = None
        self._peers.clear()
        self._fold()

    def snapshot(self) -> bytes | None:
        """The next message to send, or None when nothing changed since the last heartbeat."""
        workers = list(self._workers())
        counts = {w.url: w.own for w in workers}
        unprefilled = {w.url: w.unprefilled for w in workers if w.role is Role.WORKER}
        routed = {w.url: w.routed_total for w in workers if w.role is not Role.DECODE}
        spent = self._limits.spent() if self._limits is not None else {}
        now = self._clock()
        state = (counts, spent, unprefilled, routed)
        if state == self._sent and now - self._sent_at < self.config.heartbeat_s:
            return None
        self._seq += 1
        self._sent, self._sent_at = state, now
        snap = Snapshot(VERSION, self.replica, self._seq, counts, spent, unprefilled, routed)
        return self._encoder.encode(snap)

    def receive(self, message: bytes) -> None:
        """Take a peer's snapshot (a malformed one is counted and dropped)."""
        try:
            snap = self._decoder.decode(message)
        except msgspec.DecodeError as e:
            self.malformed += 1
            if self.malformed == 1 or self.malformed % 1000 == 0:
                log.warning(
                    "replica sync: malformed message dropped (%d so far): %s", self.malformed, e
                )
            return
        if snap.version != VERSION or snap.replica == self.replica:
            return
        self.received += 1
        peer = self._peers.get(snap.replica)
        if peer is not None and snap.seq <= peer.seq:
            return  # older than what we hold
        now = self._clock()
        if peer is not None or snap.seq == 1:
            self._charge(peer.spent if peer is not None else {}, snap.spent)
            self._add_routed(peer.routed if peer is not None else {}, snap.routed, now)
        self._peers[snap.replica] = _Peer(
            snap.seq, snap.counts, now, snap.spent, snap.unprefilled, snap.routed
        )
        self._fold()

    def _add_routed(self, before: dict[str, int], after: dict[str, int], now: float) -> None:
        """Add what a peer routed to each worker since its previous snapshot to the worker's
        recent tokens (WorkerView.recent_tokens), as of when it was heard."""
        for w in self._workers():
            added = after.get(w.url, 0) - before.get(w.url, 0)
            if added > 0:
                w.recent.add(added, now)

    def _charge(
        self, before: dict[str, tuple[float, float]], now: dict[str, tuple[float, float]]
    ) -> None:
        """Charge a peer's spending since its previous snapshot to this replica's buckets."""
        if self._limits is None:
            return
        for tenant, (requests, tokens) in now.items():
            r0, t0 = before.get(tenant, (0.0, 0.0))
            if requests != r0 or tokens != t0:
                self._limits.absorb(tenant, requests - r0, tokens - t0)

    def expire(self) -> None:
        now = self._clock()
        gone = [r for r, p in self._peers.items() if now - p.heard_at > self.config.expire_s]
        for r in gone:
            del self._peers[r]
            log.info(
                "replica sync: peer %s not heard for %.1f s; its counts dropped",
                r,
                self.config.expire_s,
            )
        if gone:
            self._fold()

    def _fold(self) -> None:
        for w in self._workers():
            w.peers = sum(p.counts.get(w.url, 0) for p in self._peers.values())
            if w.role is Role.WORKER:
                w.unprefilled_peers = sum(p.unprefilled.get(w.url, 0) for p in self._peers.values())

    async def _wait(self) -> None:
        """Until the counts may have changed, and at least send_every_s since the last look."""
        await asyncio.sleep(self.config.send_every_s)
        changed = self._changed
        if changed is None:
            return
        if not changed.is_set():
            idle = max(0.0, self.config.idle_poll_s - self.config.send_every_s)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(idle):
                    await changed.wait()
        changed.clear()  # before the snapshot: a change after it wakes the next look

    async def _send_loop(self) -> None:
        assert self._pub is not None
        while True:
            await self._wait()
            self.expire()
            message = self.snapshot()
            if message is not None:
                with contextlib.suppress(zmq.Again):  # no room: the next snapshot replaces it
                    await self._pub.send(message, zmq.NOBLOCK)

    async def _recv(self) -> None:
        assert self._sub is not None
        while True:
            self.receive(await self._sub.recv())


class SyncCollector(Collector):
    def __init__(self, sync: ReplicaSync) -> None:
        self._sync = sync

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        s = self._sync
        yield GaugeMetricFamily(
            "smetric_replica_peers",
            "Router replicas whose in-flight counts this one heard within the expiry",
            value=s.peers,
        )
        received = CounterMetricFamily(
            "smetric_replica_sync_received",
            "Replica-sync messages received: taken (a peer's snapshot) or malformed (dropped)",
            labels=["outcome"],
        )
        received.add_metric(["taken"], s.received)
        received.add_metric(["malformed"], s.malformed)
        yield received
