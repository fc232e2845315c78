"""The router queue's order on built states, on a hand-moved clock."""

from __future__ import annotations

import pytest

from smetric_router.admission.order import AdmissionQueue, Entry, Pushed
from smetric_router.admission.room import RoundRoom, WorkerRoom
from tests.helpers.clock import FakeClock

A, B = "http://a:1", "http://b:1"


def make(
    size: int = 10, timeout: float = 30.0, ceiling: float = 5.0
) -> tuple[AdmissionQueue, FakeClock]:
    clock = FakeClock()
    return AdmissionQueue(size, timeout, ceiling, clock), clock


def push(q: AdmissionQueue, worker: str | None, follow_up: bool) -> Entry:
    entry = q.push(worker, follow_up).entry
    assert entry is not None
    return entry


def cap(n: int) -> RoundRoom:
    return RoundRoom(n, (), 0)


def test_follow_ups_go_before_first_turns_that_came_earlier() -> None:
    q, clock = make()
    new1 = push(q, None, False)
    clock.advance(0.1)
    new2 = push(q, None, False)
    clock.advance(0.1)
    fu1 = push(q, A, True)
    clock.advance(0.1)
    fu2 = push(q, B, True)
    assert q.order() == [fu1, fu2, new1, new2]
    assert q.pick(cap(3)) == [fu1, fu2, new1]
    assert q.order() == [new2]


def test_new_sessions_are_admitted_oldest_first() -> None:
    q, clock = make()
    entries = []
    for _ in range(4):
        entries.append(push(q, None, False))
        clock.advance(0.01)
    assert q.pick(cap(1)) == entries[:1]
    assert q.pick(cap(2)) == entries[1:3]


def test_a_first_turn_past_the_ceiling_goes_before_follow_ups() -> None:
    q, clock = make(ceiling=5.0)
    old = push(q, None, False)
    clock.advance(4.0)
    fu = push(q, A, True)
    young = push(q, None, False)
    assert q.order() == [fu, old, young]  # under the ceiling: follow-ups first
    clock.advance(1.0)  # old has waited 5 s
    assert q.order() == [old, fu, young]
    assert q.pick(cap(1)) == [old]


def test_a_full_queue_refuses_a_first_turn() -> None:
    q, _ = make(size=2)
    push(q, None, False)
    push(q, A, True)
    pushed = q.push(None, False)
    assert pushed.entry is None and pushed.displaced is None
    assert len(q) == 2


def test_a_follow_up_displaces_the_newest_unstarved_first_turn_of_a_full_queue() -> None:
    q, clock = make(size=2, ceiling=5.0)
    old = push(q, None, False)
    clock.advance(1.0)
    young = push(q, None, False)
    pushed = q.push(A, True)
    assert pushed.displaced is young and pushed.entry is not None
    assert q.order() == [pushed.entry, old]


def test_a_follow_up_is_refused_when_only_follow_ups_or_starved_first_turns_wait() -> None:
    q, clock = make(size=2, ceiling=5.0)
    push(q, A, True)
    push(q, None, False)
    clock.advance(5.0)  # the first turn is starved: it keeps its place
    assert q.push(B, True) == Pushed(None)
    q2, _ = make(size=1)
    push(q2, A, True)
    assert q2.push(B, True).entry is None


def test_size_zero_queues_nothing() -> None:
    q, _ = make(size=0)
    assert q.push(None, False).entry is None
    assert q.push(A, True).entry is None


def test_entries_time_out_in_arrival_order_and_leave_the_queue() -> None:
    q, clock = make(timeout=2.0)
    first = push(q, None, False)
    clock.advance(1.0)
    second = push(q, A, True)
    assert q.expired() == []
    clock.advance(1.0)
    assert q.expired() == [first]
    clock.advance(1.0)
    assert q.expired() == [second]
    assert len(q) == 0


def test_next_event_is_the_earliest_timeout_or_ceiling() -> None:
    q, clock = make(timeout=10.0, ceiling=3.0)
    assert q.next_event() is None
    push(q, A, True)
    assert q.next_event() == clock.now + 10.0
    push(q, None, False)
    assert q.next_event() == clock.now + 3.0


def test_cancellation_removes_the_entry_once() -> None:
    q, _ = make()
    fu = push(q, A, True)
    new = push(q, None, False)
    assert q.remove(fu) and q.remove(new)
    assert not q.remove(fu)
    assert len(q) == 0 and q.order() == [] and q.pick(cap(5)) == []


def test_a_follow_up_whose_worker_is_full_does_not_block_the_others() -> None:
    q, clock = make()
    busy = push(q, A, True)
    clock.advance(0.1)
    free = push(q, B, True)
    new = push(q, None, False)
    room = RoundRoom(None, [WorkerRoom(A, True, 4), WorkerRoom(B, True, 0)], max_queued=4)
    assert q.pick(room) == [free, new]
    assert q.order() == [busy]


def test_max_size_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="max_size"):
        AdmissionQueue(-1, 1.0, 1.0, FakeClock())
