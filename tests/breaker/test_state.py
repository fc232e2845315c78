"""A worker's circuit on a hand-moved clock: thresholds, the ratio window, cool-down, probes."""

from __future__ import annotations

import pytest

from smetric_router.breaker.state import Breaker, BreakerConfig, Outcome, State, Verdict
from tests.helpers.clock import FakeClock

OK, FAIL, IGNORED = Outcome.SUCCESS, Outcome.FAILURE, Outcome.IGNORED


def make(clock: FakeClock, **kw: float) -> tuple[Breaker, list[State]]:
    moves: list[State] = []
    settings: dict[str, float] = {"failure_threshold": 3, "success_threshold": 2, "open_s": 10}
    settings.update(kw)
    config = BreakerConfig(**settings)  # type: ignore[arg-type]
    return Breaker(config, clock, moves.append), moves


def state(b: Breaker) -> State:
    # read through a call: mypy would keep a narrowed b.state across the calls that move it
    return b.state


def run(b: Breaker, *outcomes: Outcome) -> None:
    for o in outcomes:
        passed = b.begin()
        assert passed is not None
        b.record(passed, o)


def test_consecutive_failures_open_it_and_a_success_resets_the_count() -> None:
    clock = FakeClock()
    b, moves = make(clock)
    run(b, FAIL, FAIL, OK, FAIL, FAIL)
    assert state(b) is State.CLOSED
    run(b, FAIL)
    assert state(b) is State.OPEN and moves == [State.OPEN]
    assert not b.available() and b.begin() is None


def test_client_errors_and_ignored_outcomes_neither_count_nor_reset() -> None:
    clock = FakeClock()
    b, _ = make(clock)
    v = Verdict()
    v.answered(404)
    assert v.outcome is IGNORED
    v.answered(429)
    assert v.outcome is IGNORED
    run(b, FAIL, FAIL, v.outcome, v.outcome, IGNORED)
    assert state(b) is State.CLOSED
    run(b, FAIL)  # the run of failures went on through the 4xx
    assert state(b) is State.OPEN


def test_verdicts_of_answers() -> None:
    for status, outcome in ((200, OK), (302, OK), (400, IGNORED), (500, FAIL), (503, FAIL)):
        v = Verdict()
        v.answered(status)
        assert v.outcome is outcome, status
    v = Verdict()
    assert v.outcome is IGNORED  # nothing said: a cancelled attempt
    v.failed()
    assert v.outcome is FAIL


def test_cool_down_then_half_open_lets_a_bounded_number_of_probes_through() -> None:
    clock = FakeClock()
    b, moves = make(clock, half_open_max=2)
    run(b, FAIL, FAIL, FAIL)
    clock.advance(9.9)
    assert state(b) is State.OPEN and b.begin() is None
    clock.advance(0.1)
    assert state(b) is State.HALF_OPEN
    first, second = b.begin(), b.begin()
    assert first is not None and second is not None and first.probe and second.probe
    assert b.begin() is None and not b.available()  # both probe slots taken
    b.record(first, IGNORED)  # a probe that said nothing frees its slot
    assert b.available()
    b.record(second, OK)
    assert state(b) is State.HALF_OPEN
    run(b, OK)
    assert state(b) is State.CLOSED
    assert moves == [State.OPEN, State.HALF_OPEN, State.CLOSED]


def test_a_probe_failure_reopens_it_for_a_fresh_cool_down() -> None:
    clock = FakeClock()
    b, moves = make(clock)
    run(b, FAIL, FAIL, FAIL)
    clock.advance(10)
    run(b, OK, FAIL)
    assert state(b) is State.OPEN
    assert b.retry_at == clock.now + 10
    clock.advance(9)
    assert state(b) is State.OPEN
    clock.advance(1)
    assert state(b) is State.HALF_OPEN
    assert moves == [State.OPEN, State.HALF_OPEN, State.OPEN, State.HALF_OPEN]


def test_outcomes_of_requests_begun_before_a_transition_are_dropped() -> None:
    clock = FakeClock()
    b, _ = make(clock)
    slow = b.begin()  # sent while closed, answers long after
    assert slow is not None
    run(b, FAIL, FAIL, FAIL)
    clock.advance(10)
    probe = b.begin()
    assert probe is not None and state(b) is State.HALF_OPEN
    b.record(slow, FAIL)  # says nothing about the worker the probe is testing
    assert state(b) is State.HALF_OPEN
    b.record(probe, OK)
    run(b, OK)
    assert state(b) is State.CLOSED


def test_the_failure_ratio_opens_it_only_from_the_minimum_of_outcomes_on() -> None:
    clock = FakeClock()
    b, _ = make(clock, failure_threshold=100, failure_ratio=0.5, min_requests=6, window_s=60)
    run(b, FAIL, OK, FAIL, OK, FAIL)  # 3 of 5: too few outcomes to judge
    assert state(b) is State.CLOSED
    run(b, OK)  # 3 of 6
    assert state(b) is State.OPEN


def test_the_ratio_window_forgets_old_outcomes() -> None:
    clock = FakeClock()
    b, _ = make(clock, failure_threshold=100, failure_ratio=0.5, min_requests=4, window_s=60)
    run(b, FAIL, FAIL, FAIL)
    clock.advance(61)  # those three left the window
    run(b, OK, OK, FAIL)
    assert state(b) is State.CLOSED
    run(b, OK)  # 1 of 4
    assert state(b) is State.CLOSED
    run(b, FAIL)  # 2 of 5 is under half
    assert state(b) is State.CLOSED
    run(b, FAIL)  # 3 of 6
    assert state(b) is State.OPEN


def test_describe_says_the_state_and_when_it_is_tried_again() -> None:
    clock = FakeClock()
    b, _ = make(clock)
    assert b.describe() == {"state": "closed", "consecutive_failures": 0}
    run(b, FAIL, FAIL, FAIL)
    clock.advance(4)
    assert b.describe() == {"state": "open", "consecutive_failures": 0, "retry_in_s": 6.0}
    clock.advance(6)
    assert b.describe()["state"] == "half-open"


@pytest.mark.parametrize(
    "bad",
    [
        {"failure_threshold": 0},
        {"success_threshold": 0},
        {"half_open_max": 0},
        {"open_s": 0},
        {"window_s": -1},
        {"failure_ratio": 1.5},
        {"min_requests": 0},
    ],
)
def test_bad_settings_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        BreakerConfig(**bad)  # type: ignore[arg-type]
