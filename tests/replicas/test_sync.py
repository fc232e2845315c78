"""What one replica makes of its peers' snapshots (no sockets: messages handed over directly)."""

from __future__ import annotations

import asyncio

import msgspec

from smetric_router.core.decay import RECENT_HALF_LIFE_S
from smetric_router.replicas.sync import VERSION, ReplicaSync, Snapshot, SyncConfig
from smetric_router.router.workers import Role, Worker
from tests.helpers.clock import FakeClock

A, B = "http://a:1", "http://b:1"


def replica(workers: list[Worker], clock: FakeClock) -> ReplicaSync:
    return ReplicaSync(SyncConfig("inproc://unused", ()), lambda: workers, clock=clock)


def pair() -> tuple[list[Worker], list[Worker], ReplicaSync, ReplicaSync, FakeClock]:
    clock = FakeClock()
    mine, theirs = [Worker(A), Worker(B)], [Worker(A), Worker(B)]
    return mine, theirs, replica(mine, clock), replica(theirs, clock), clock


def hand_over(src: ReplicaSync, dst: ReplicaSync) -> None:
    """src's next snapshot, received by dst."""
    message = src.snapshot()
    assert message is not None
    dst.receive(message)


def test_a_peers_dispatch_counts_on_the_same_worker() -> None:
    mine, theirs, me, peer, _ = pair()
    theirs[0].inflight = 3
    message = peer.snapshot()
    assert message is not None
    me.receive(message)
    assert [w.peers for w in mine] == [3, 0]
    assert mine[0].load(now=0.0, max_age=1.0) == 3.0
    assert [w.inflight for w in mine] == [0, 0]  # the own count is left alone


def test_a_snapshot_replaces_the_last_and_peers_add_up() -> None:
    mine, theirs, me, peer, clock = pair()
    third = replica(other := [Worker(A), Worker(B)], clock)
    theirs[0].inflight, other[0].inflight, other[1].inflight = 2, 1, 4
    for r in (peer, third):
        m = r.snapshot()
        assert m is not None
        me.receive(m)
    assert [w.peers for w in mine] == [3, 4]
    theirs[0].inflight = 0
    m = peer.snapshot()
    assert m is not None
    me.receive(m)
    assert [w.peers for w in mine] == [1, 4]


def test_nothing_is_sent_until_a_count_changes_or_the_heartbeat_is_due() -> None:
    _, theirs, _, peer, clock = pair()
    assert peer.snapshot() is not None
    assert peer.snapshot() is None
    theirs[1].inflight = 1
    assert peer.snapshot() is not None
    clock.advance(peer.config.heartbeat_s)
    assert peer.snapshot() is not None


def test_an_older_snapshot_its_own_and_unknown_workers_change_nothing() -> None:
    mine, theirs, me, peer, _ = pair()
    theirs[0].inflight = 2
    old = peer.snapshot()
    theirs[0].inflight = 5
    new = peer.snapshot()
    assert old is not None and new is not None
    me.receive(new)
    me.receive(old)
    assert mine[0].peers == 5
    mine[1].inflight = 7
    own = me.snapshot()
    assert own is not None
    me.receive(own)
    assert mine[1].peers == 0
    forged = Snapshot(VERSION, "someone", 1, {"http://elsewhere:1": 9})
    me.receive(msgspec.msgpack.encode(forged))
    assert [w.peers for w in mine] == [5, 0]


def test_a_malformed_message_is_counted_and_dropped() -> None:
    mine, _, me, _, _ = pair()
    me.receive(b"\x93not msgpack of a snapshot")
    me.receive(msgspec.msgpack.encode([VERSION, "x", 1, {A: "three"}]))
    assert me.malformed == 2 and me.received == 0
    assert [w.peers for w in mine] == [0, 0]


def test_a_silent_peer_expires_and_the_reports_take_over() -> None:
    mine, theirs, me, peer, clock = pair()
    theirs[0].inflight = 2
    m = peer.snapshot()
    assert m is not None
    me.receive(m)
    assert me.peers == 1
    clock.advance(me.config.expire_s / 2)
    me.expire()
    assert mine[0].peers == 2
    clock.advance(me.config.expire_s)
    me.expire()
    assert me.peers == 0 and mine[0].peers == 0


def test_the_report_adds_only_what_neither_this_replica_nor_its_peers_sent() -> None:
    w = Worker(A)
    w.inflight, w.peers = 1, 2
    # the poll's bookkeeping, as WorkerRegistry._poll_one does it
    w.reported_load, w.reported_at = 5.0, 10.0
    w.own_at_report, w.peers_at_report = w.own, w.peers
    assert w.load(now=10.0, max_age=1.0) == 5.0  # 1 + 2 + (5 - 3) routed elsewhere
    w.peers = 0  # the peer's requests finished: they stop counting before the next report
    assert w.load(now=10.0, max_age=1.0) == 3.0
    assert w.load(now=12.0, max_age=1.0) == 1.0  # a stale report adds nothing


def test_pd_instances_share_their_own_unit_and_no_unprefilled_share() -> None:
    clock = FakeClock()
    mine, theirs = [Worker(A, role=Role.PREFILL)], [Worker(A, role=Role.PREFILL)]
    me, peer = replica(mine, clock), replica(theirs, clock)
    theirs[0].tokens = 4096  # unprefilled tokens, not requests
    theirs[0].unprefilled = 10  # a colocated worker's count: never a prefill's
    m = peer.snapshot()
    assert m is not None
    assert msgspec.msgpack.decode(m, type=Snapshot).unprefilled == {}
    me.receive(m)
    assert (mine[0].peers, mine[0].unprefilled_peers) == (4096, 0)


def test_a_peers_unprefilled_tokens_count_on_the_same_colocated_worker() -> None:
    mine, theirs, me, peer, _ = pair()
    theirs[1].unprefilled = 700
    hand_over(peer, me)
    assert [w.unprefilled_peers for w in mine] == [0, 700]
    assert [w.unprefilled_load(now=0.0, max_age=1.0) for w in mine] == [0, 700]
    assert [w.unprefilled for w in mine] == [0, 0]  # the own count is left alone
    theirs[1].unprefilled = 0  # its first token came back
    hand_over(peer, me)
    assert mine[1].unprefilled_load(now=0.0, max_age=1.0) == 0


def test_a_peers_routed_tokens_add_to_the_same_workers_recent_sum() -> None:
    mine, theirs, me, peer, clock = pair()
    theirs[1].routed_total = 700
    hand_over(peer, me)  # its first snapshot: everything it routed counts
    assert [w.recent.value(clock()) for w in mine] == [0, 700]
    theirs[1].routed_total = 1000
    hand_over(peer, me)
    assert mine[1].recent.value(clock()) == 1000
    assert [w.routed_total for w in mine] == [0, 0]  # the own total is left alone
    clock.advance(RECENT_HALF_LIFE_S)
    assert mine[1].recent.value(clock()) == 500
    clock.advance(peer.config.heartbeat_s)
    hand_over(peer, me)  # a heartbeat repeats the total: nothing is added twice
    assert mine[1].recent.value(clock()) < 500


def test_a_peer_first_heard_late_adds_only_what_it_routes_from_then() -> None:
    mine, theirs, me, peer, clock = pair()
    theirs[0].routed_total = 5000
    assert peer.snapshot() is not None  # lost: this replica was not listening yet
    theirs[0].routed_total = 5200
    hand_over(peer, me)
    assert mine[0].recent.value(clock()) == 0
    theirs[0].routed_total = 5300
    hand_over(peer, me)
    assert mine[0].recent.value(clock()) == 100


def test_a_peer_one_release_behind_still_shares_its_request_counts() -> None:
    """A snapshot without the trailing unprefilled field (the previous wire) decodes as none."""
    clock = FakeClock()
    mine = [Worker(A)]
    me = replica(mine, clock)
    old = msgspec.msgpack.encode([VERSION, "older-replica", 1, {A: 2}, {}])
    me.receive(old)
    assert (mine[0].peers, mine[0].unprefilled_peers, me.malformed) == (2, 0, 0)


def test_the_report_adds_only_the_uncached_tokens_no_syncing_router_sent() -> None:
    w = Worker(A)
    w.unprefilled, w.unprefilled_peers = 300, 200
    # the poll's bookkeeping, as WorkerRegistry._poll_one does it
    w.reported_unprefilled, w.reported_at = 900.0, 10.0
    w.unprefilled_at_report = w.unprefilled + w.unprefilled_peers
    assert w.unprefilled_load(now=10.0, max_age=1.0) == 900  # 300 + 200 + 400 from elsewhere
    w.unprefilled = 0  # ours got its first token before the next report
    assert w.unprefilled_load(now=10.0, max_age=1.0) == 600
    w.reported_unprefilled = 100.0  # SGLang's waiting queue only: less than ours, no negative rest
    assert w.unprefilled_load(now=10.0, max_age=1.0) == 200
    assert w.unprefilled_load(now=12.0, max_age=1.0) == 200  # a stale report adds nothing


async def test_a_change_wakes_the_sender_before_its_idle_poll() -> None:
    changed = asyncio.Event()
    config = SyncConfig("inproc://unused", (), send_every_s=0.0, idle_poll_s=3600.0)
    sync = ReplicaSync(config, lambda: [Worker(A)], changed=changed)
    look = asyncio.create_task(sync._wait())
    for _ in range(5):
        await asyncio.sleep(0)
    assert not look.done()  # nothing changed: it waits (up to the idle poll)
    changed.set()
    await asyncio.wait_for(look, 10)
    assert not changed.is_set()  # cleared before the snapshot it wakes for


async def test_without_a_change_the_sender_still_looks_every_idle_poll() -> None:
    config = SyncConfig("inproc://unused", (), send_every_s=0.0, idle_poll_s=0.01)
    sync = ReplicaSync(config, lambda: [Worker(A)], changed=asyncio.Event())
    await asyncio.wait_for(sync._wait(), 10)
