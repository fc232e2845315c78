"""Router replicas hold a tenant to its rate limits as one router: each charges its peers'
spending to its own buckets (snapshots handed over directly, on one hand-moved clock)."""

from __future__ import annotations

import time
from pathlib import Path

from smetric_router.admission.buckets import Limits, RateLimiter
from smetric_router.replicas.sync import ReplicaSync, SyncConfig
from tests.helpers.clock import FakeClock
from tests.helpers.polling import eventually


def replica(clock: FakeClock, per_minute: float = 6, router_tps: float = 0.0
            ) -> tuple[RateLimiter, ReplicaSync]:  # fmt: skip
    limits = RateLimiter([("alpha", Limits(requests_per_minute=per_minute))], clock, router_tps)
    return limits, ReplicaSync(SyncConfig("inproc://unused", ()), list, clock, limits)


def hand_over(src: ReplicaSync, *dst: ReplicaSync, changed: bool = True) -> None:
    """src's next snapshot to dst; changed: it must have one (else it may have nothing new)."""
    message = src.snapshot()
    if message is None:
        assert not changed, "no snapshot to hand over"
        return
    for d in dst:
        d.receive(message)


def test_two_replicas_let_a_tenants_minute_through_once_not_twice() -> None:
    clock = FakeClock()
    (la, a), (lb, b) = replica(clock), replica(clock)
    hand_over(a, b)
    hand_over(b, a)  # both know each other from their first snapshot
    passed = 0
    for i in range(12):  # alternate replicas, as a load balancer would
        limits, me, other = (la, a, b) if i % 2 == 0 else (lb, b, a)
        if limits.charge("alpha", 10) is None:
            passed += 1
        hand_over(me, other, changed=False)
    assert passed == 6
    # unsynced, each replica would have let its own six through
    lone = RateLimiter([("alpha", Limits(requests_per_minute=6))], clock)
    assert sum(lone.charge("alpha", 10) is None for _ in range(6)) == 6


def test_a_peers_refund_is_given_back_here_too() -> None:
    clock = FakeClock()
    (la, a), (lb, b) = replica(clock, per_minute=2), replica(clock, per_minute=2)
    hand_over(a, b)
    assert la.charge("alpha", 1) is None and la.charge("alpha", 1) is None
    hand_over(a, b)
    assert lb.charge("alpha", 1) is not None  # the peer spent the minute
    la.refund("alpha", 1)  # one of them was shed by the queue
    hand_over(a, b)
    assert lb.charge("alpha", 1) is None


def test_a_lost_snapshot_is_folded_into_the_next() -> None:
    clock = FakeClock()
    (la, a), (lb, b) = replica(clock), replica(clock)
    hand_over(a, b)
    for _ in range(3):
        assert la.charge("alpha", 1) is None
    assert a.snapshot() is not None  # lost on the way
    for _ in range(3):
        assert la.charge("alpha", 1) is None
    hand_over(a, b)
    assert lb.charge("alpha", 1) is not None


def test_a_peer_first_heard_late_is_a_baseline_only() -> None:
    clock = FakeClock()
    (la, a), (lb, b) = replica(clock), replica(clock)
    assert la.charge("alpha", 1) is None
    assert a.snapshot() is not None  # its first snapshot: b did not hear it
    la.charge("alpha", 1)
    hand_over(a, b)  # b starts after a: what a spent before is not charged here
    assert sum(lb.charge("alpha", 1) is None for _ in range(6)) == 6


def test_the_router_wide_rate_is_shared_too() -> None:
    clock = FakeClock()
    la = RateLimiter([], clock, router_tokens_per_second=100)
    lb = RateLimiter([], clock, router_tokens_per_second=100)
    a = ReplicaSync(SyncConfig("inproc://unused", ()), list, clock, la)
    b = ReplicaSync(SyncConfig("inproc://unused", ()), list, clock, lb)
    hand_over(a, b)
    assert la.charge("anyone", 100) is None  # a second's worth
    hand_over(a, b)
    refused = lb.charge("someone-else", 50)
    assert refused is not None and refused.router_wide
    assert lb.spent() == {} and la.spent() == {"anyone": (1.0, 100.0)}


async def test_spending_crosses_real_sockets(tmp_path: Path) -> None:
    """Over ZeroMQ as the router runs it: what one replica lets through reaches the other's
    buckets."""
    clock = time.monotonic
    ends = [f"ipc://{tmp_path}/a", f"ipc://{tmp_path}/b"]
    syncs = []
    limiters = []
    for end in ends:
        limits = RateLimiter([("alpha", Limits(requests_per_minute=3))], clock)
        syncs.append(ReplicaSync(SyncConfig(end, tuple(ends)), list, clock, limits))
        limiters.append(limits)
    for s in syncs:
        await s.start()
    try:
        await eventually(lambda: all(s.peers == 1 for s in syncs), "the replicas hear each other")
        for _ in range(3):
            assert limiters[0].charge("alpha", 1) is None
        # check() takes nothing: only the peer's spending can empty these buckets
        refused = await eventually(
            lambda: limiters[1].check("alpha", 1), "the peer's spending reaches the buckets"
        )
        assert refused.limit == "requests"
    finally:
        for s in syncs:
            await s.stop()
