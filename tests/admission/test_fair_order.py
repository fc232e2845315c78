"""Tenants in the router queue's order, on a hand-moved clock: weighted shares under
contention, priority within a tenant, the session-aware classes and the starvation ceiling kept,
and a full queue's places shared by weight."""

from __future__ import annotations

from collections import Counter

from smetric_router.admission.order import AdmissionQueue, Entry
from smetric_router.admission.room import RoundRoom
from tests.helpers.clock import FakeClock

A = "http://a:1"


def make(
    weights: dict[str, float], size: int = 1000, ceiling: float = 5.0
) -> tuple[AdmissionQueue, FakeClock]:
    clock = FakeClock()
    return AdmissionQueue(size, 30.0, ceiling, clock, weights), clock


def push(q: AdmissionQueue, tenant: str, follow_up: bool = False, priority: int = 0) -> Entry:
    entry = q.push(A if follow_up else None, follow_up, tenant, priority).entry
    assert entry is not None
    return entry


def one() -> RoundRoom:
    return RoundRoom(1, (), 0)


def test_weights_1_and_3_share_admissions_1_to_3_under_contention() -> None:
    q, clock = make({"small": 1, "big": 3})
    for _ in range(200):
        push(q, "small")
        push(q, "big")
        clock.advance(0.001)
    served: Counter[str] = Counter()
    for _ in range(100):  # one slot frees at a time, both always waiting
        (e,) = q.pick(one())
        served[e.tenant] += 1
    assert served == {"small": 25, "big": 75}
    # and at any point the shares never drift by more than one admission
    order = [e.tenant for e in q.order()][:40]
    assert abs(order.count("big") - 3 * order.count("small")) <= 3


def test_a_tenant_alone_takes_every_slot_and_an_idle_one_banks_nothing() -> None:
    q, clock = make({"a": 1, "b": 1})
    for _ in range(10):
        push(q, "a")
    assert [e.tenant for e in q.pick(RoundRoom(10, (), 0))] == ["a"] * 10
    # b was idle while a took 10: it joins at the current virtual time, not 10 turns ahead
    for _ in range(4):
        push(q, "a")
        push(q, "b")
        clock.advance(0.001)
    picked = [e.tenant for e in q.pick(RoundRoom(4, (), 0))]
    assert sorted(picked) == ["a", "a", "b", "b"], picked


def test_priority_orders_a_tenants_entries_before_age() -> None:
    q, clock = make({"a": 1})
    low = push(q, "a", priority=0)
    clock.advance(0.1)
    mid = push(q, "a", priority=5)
    clock.advance(0.1)
    high = push(q, "a", priority=10)
    clock.advance(0.1)
    mid2 = push(q, "a", priority=5)
    assert q.order() == [high, mid, mid2, low]


def test_priority_does_not_jump_another_tenants_share() -> None:
    q, clock = make({"a": 1, "b": 1})
    a1 = push(q, "a")
    clock.advance(0.1)
    b1 = push(q, "b", priority=100)
    clock.advance(0.1)
    b2 = push(q, "b", priority=100)
    # shares alternate; a's older entry goes first on the tie; b's priority orders only b's own
    assert q.order() == [a1, b1, b2]


def test_follow_ups_still_go_before_first_turns_across_tenants() -> None:
    q, clock = make({"a": 1, "b": 3})
    news = [push(q, "b", priority=50) for _ in range(3)]
    clock.advance(0.1)
    follow = push(q, "a", follow_up=True)
    order = q.order()
    assert order[0] is follow and order[1:] == news


def test_the_starvation_ceiling_still_holds_with_tenants() -> None:
    q, clock = make({"a": 1, "b": 1}, ceiling=5.0)
    old = push(q, "a")
    clock.advance(5.0)
    follows = [push(q, "b", follow_up=True) for _ in range(3)]
    young = push(q, "b")
    assert q.order() == [old, *follows, young]
    assert q.pick(one()) == [old]


def test_a_full_queue_shares_its_places_by_weight() -> None:
    q, clock = make({"flood": 1, "quiet": 1}, size=4)
    flood = [push(q, "flood") for _ in range(4)]
    clock.advance(0.1)
    # a first turn of a tenant with no place takes the newest place of the one with most
    pushed = q.push(None, False, "quiet")
    assert pushed.entry is not None and pushed.displaced is flood[-1]
    # once shares are level nothing more is displaced for a first turn
    q.push(None, False, "quiet")
    assert q.counts() == {"flood": 2, "quiet": 2}
    assert q.push(None, False, "quiet").entry is None
    assert q.push(None, False, "flood").entry is None
    # a follow-up still displaces: from the tenant holding the most for its weight
    follow = q.push(A, True, "quiet")
    assert follow.displaced is not None and follow.displaced.tenant == "quiet"


def test_one_anonymous_tenant_orders_as_before() -> None:
    q = AdmissionQueue(10, 30.0, 5.0, FakeClock())
    entries = [q.push(None, False).entry for _ in range(3)]
    assert all(e is not None and e.tenant == "anonymous" for e in entries)
    assert q.order() == entries
    assert q.push(None, False).entry is not None  # fills 4 of 10; refuses none


def test_a_tenants_follow_ups_do_not_shut_out_another_tenants_new_sessions() -> None:
    """The share is the tenant's first: a swarm with many sessions running (so many follow-ups)
    takes its share, and another tenant's first turns get theirs."""
    q, clock = make({"swarm": 1, "alpha": 1})
    swarm = [push(q, "swarm", follow_up=True) for _ in range(6)]
    assert q.pick(one()) == [swarm[0]]  # alone, it takes every slot
    assert q.pick(one()) == [swarm[1]]
    clock.advance(0.1)
    news = [push(q, "alpha") for _ in range(2)]
    order = q.order()
    assert order[:2] == [news[0], swarm[2]]  # alpha starts level with the latest admission
    taken = Counter(e.tenant for e in order[:4])
    assert taken == {"alpha": 2, "swarm": 2}


def test_a_tenant_under_its_share_of_running_slots_goes_first() -> None:
    """Shares are of the slots in use: a tenant holding few running requests takes the next
    slots, even when admissions alone would have alternated."""
    q, clock = make({"swarm": 1, "alpha": 1})
    for _ in range(6):
        push(q, "alpha")
        push(q, "swarm")
        clock.advance(0.001)
    picked = [e.tenant for e in q.pick(RoundRoom(4, (), 0), {"swarm": 10, "alpha": 2})]
    assert picked == ["alpha"] * 4
    # level shares alternate again, the virtual time breaking the tie
    picked = [e.tenant for e in q.pick(RoundRoom(4, (), 0), {"swarm": 10, "alpha": 10})]
    assert sorted(picked) == ["alpha", "alpha", "swarm", "swarm"]


def test_running_slots_are_shared_by_weight() -> None:
    q, clock = make({"small": 1, "big": 3})
    for _ in range(20):
        push(q, "small")
        push(q, "big")
        clock.advance(0.001)
    # big holds 3 for its weight 3 (a share of 1), small holds 2: big goes first until level
    picked = [e.tenant for e in q.pick(RoundRoom(4, (), 0), {"big": 3, "small": 2})]
    assert picked.count("big") == 3 and picked.count("small") == 1
