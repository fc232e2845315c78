"""The circuits of all workers and their metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from smetric_router.breaker.board import UNTRACKED, Breakers
from smetric_router.breaker.metrics import BreakerMetrics
from smetric_router.breaker.state import BreakerConfig, Outcome, State
from tests.helpers.clock import FakeClock

A, B = "http://a:1", "http://b:1"


def sample(r: CollectorRegistry, name: str, **labels: str) -> float | None:
    return r.get_sample_value(name, labels)


def fail(board: Breakers, worker: str) -> None:
    passed = board.begin(worker)
    assert passed is not None
    board.record(worker, passed, Outcome.FAILURE)


def test_circuits_are_per_worker_and_their_moves_are_counted() -> None:
    clock, r = FakeClock(), CollectorRegistry()
    board = Breakers(BreakerConfig(failure_threshold=2, open_s=5), BreakerMetrics(r), clock)
    assert board.available(A) and board.state(A) is State.CLOSED  # never used: closed
    fail(board, A)
    fail(board, A)
    fail(board, B)
    assert not board.available(A) and board.available(B)
    assert sample(r, "smetric_breaker_state", worker=A) == 2
    assert sample(r, "smetric_breaker_state", worker=B) == 0
    assert sample(r, "smetric_breaker_transitions_total", worker=A, to="open") == 1
    clock.advance(5)
    assert board.state(A) is State.HALF_OPEN
    assert sample(r, "smetric_breaker_state", worker=A) == 1
    assert sample(r, "smetric_breaker_transitions_total", worker=A, to="half-open") == 1


def test_untracked_attempts_and_removed_workers_leave_no_trace() -> None:
    r = CollectorRegistry()
    board = Breakers(BreakerConfig(failure_threshold=1), BreakerMetrics(r), FakeClock())
    board.circuit(A)
    board.record(A, UNTRACKED, Outcome.FAILURE)
    assert board.available(A)
    fail(board, A)
    board.remove(A)
    assert sample(r, "smetric_breaker_state", worker=A) is None
    assert board.available(A)  # back under the same URL: closed
