"""One admission round's room: the cluster cap and the workers' reported queues."""

from __future__ import annotations

from smetric_router.admission.room import RoundRoom, WorkerRoom, queued

A, B = "http://a:1", "http://b:1"


def test_queued_is_load_beyond_the_running_batch() -> None:
    assert queued(7.0, 5) == 2.0
    assert queued(3.0, 5) == 0.0  # the report ran ahead of the router's count
    assert queued(9.0, None) == 0.0  # no fresh report: unknown counts as empty


def test_the_cluster_cap_is_spent_by_takes() -> None:
    room = RoundRoom(2, (), 0)
    assert room.fits(None) and room.fits(A)
    room.take(A)
    room.take(None)
    assert not room.fits(None) and not room.fits(A)


def test_no_cap_and_no_worker_bound_fits_everything() -> None:
    room = RoundRoom(None, (), 0)
    for _ in range(100):
        assert room.fits(A)
        room.take(A)


def test_a_worker_at_its_queue_bound_takes_no_follow_up_but_first_turns_go_elsewhere() -> None:
    room = RoundRoom(None, [WorkerRoom(A, True, 2.0), WorkerRoom(B, True, 1.0)], max_queued=2)
    assert not room.fits(A)
    assert room.fits(B) and room.fits(None)
    room.take(None)  # charged to B, the lightest
    assert not room.fits(B) and not room.fits(None)


def test_unknown_and_unhealthy_holders_fit_so_their_dispatch_fails_over() -> None:
    room = RoundRoom(None, [WorkerRoom(A, False, 9.0)], max_queued=1)
    assert room.fits(A)
    assert room.fits("http://gone:1")
    assert not room.fits(None)  # no healthy worker with room


def test_a_room_without_free_slots_is_exhausted_for_every_worker() -> None:
    full = RoundRoom(0, [WorkerRoom("http://a:1", True, 0.0)], 4)
    assert full.exhausted and not full.fits(None) and not full.fits("http://a:1")
    assert not RoundRoom(None, [], 0).exhausted  # no cluster cap: never exhausted as a whole
    one = RoundRoom(1, [], 0)
    assert not one.exhausted
    one.take(None)
    assert one.exhausted
