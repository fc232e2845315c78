"""Retry-After from the queue's pace, on a hand-moved clock: the measured rate per tenant and
class, the wait it gives for what is queued ahead, its bounds, and the gate's refusals using it."""

from __future__ import annotations

import asyncio

import pytest

from smetric_router.admission.gate import Shed
from smetric_router.admission.pace import MAX_S, MIN_S, Pace
from tests.helpers.clock import FakeClock
from tests.helpers.gate import make_gate, queued


def steady(pace: Pace, clock: FakeClock, tenant: str, follow_up: bool, per_s: float,
           seconds: float) -> None:  # fmt: skip
    for _ in range(round(per_s * seconds)):
        clock.advance(1.0 / per_s)
        pace.admitted(tenant, follow_up)


def test_the_rate_is_what_was_admitted_lately_per_tenant_and_class() -> None:
    clock = FakeClock()
    pace = Pace(clock, window_s=10.0)
    assert pace.rate("a", False) == 0.0
    for tick in range(480):  # 60 s: a follow-up every 1/8 s, a first turn every 1/2 s
        clock.advance(0.125)
        pace.admitted("a", True)
        if tick % 4 == 3:
            pace.admitted("a", False)
    assert pace.rate("a", False) == pytest.approx(2.0, rel=0.1)
    assert pace.rate("a", True) == pytest.approx(8.0, rel=0.1)
    assert pace.rate("b", False) == 0.0
    clock.advance(30.0)  # nothing admitted for three windows: the pace has slowed
    assert pace.rate("a", False) < 0.15  # 2 x e^-3


def test_a_young_average_is_not_read_as_a_crawl() -> None:
    clock = FakeClock()
    pace = Pace(clock, window_s=10.0)
    steady(pace, clock, "a", False, 4.0, 2.0)  # 2 s of a 10 s window
    assert pace.rate("a", False) == pytest.approx(4.0, rel=0.15)


def test_the_wait_is_what_is_queued_ahead_over_the_pace() -> None:
    clock = FakeClock()
    pace = Pace(clock)
    assert pace.retry_after("a", False, ahead=50, fallback=7) == 7  # no pace known yet
    steady(pace, clock, "a", False, 2.0, 60.0)
    assert pace.retry_after("a", False, ahead=9, fallback=7) == 5  # (9 + 1) / 2
    assert pace.retry_after("a", False, ahead=0, fallback=7) == MIN_S
    assert pace.retry_after("a", False, ahead=10_000, fallback=7) == MAX_S


def test_a_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="window_s"):
        Pace(FakeClock(), window_s=0)


async def test_a_refused_first_turn_is_told_its_queue_s_pace() -> None:
    gate, clock, _ = make_gate(cap=1, size=3, timeout=2.0)
    for _ in range(20):  # first turns admitted one a second
        clock.advance(1.0)
        (await gate.admit(None, False)).release()
    held = await gate.admit(None, False)
    waiting = [asyncio.create_task(gate.admit(None, False)) for _ in range(3)]
    await queued(gate, 3)
    with pytest.raises(Shed) as full:
        await gate.admit(None, False)
    # three first turns wait ahead of it at about one a second
    assert full.value.reason == "queue_full" and full.value.retry_after in (4, 5)
    clock.advance(2.0)
    for w in waiting:
        with pytest.raises(Shed) as late:
            await w
        assert late.value.reason == "timeout" and 1 <= late.value.retry_after <= 4
    held.release()
    await gate.close()


async def test_before_any_admission_the_wait_is_the_timeout() -> None:
    gate, _, _ = make_gate(cap=0, size=0, timeout=7.0)
    with pytest.raises(Shed) as e:
        await gate.admit(None, False)
    assert e.value.retry_after == 7
    await gate.close()


def test_a_tenant_under_its_share_is_told_a_short_wait_beside_a_backlogged_one() -> None:
    clock = FakeClock()
    pace = Pace(clock)
    for _ in range(60):  # both admitted one first turn a second
        clock.advance(1.0)
        pace.admitted("alpha", False)
        pace.admitted("swarm", False)
    assert 19 <= pace.retry_after("swarm", False, ahead=20, fallback=2) <= 21  # 21 / ~1 per s
    assert pace.retry_after("alpha", False, ahead=0, fallback=2) == 1


def test_a_tenant_back_from_idle_is_told_its_share_not_its_decayed_rate() -> None:
    clock = FakeClock()
    pace = Pace(clock, weights={"beta": 3.0})
    pace.admitted("alpha", False)
    for _ in range(600):  # alpha idle for ten minutes while beta is admitted 4 a second
        clock.advance(0.25)
        pace.admitted("beta", False)
    assert pace.rate("alpha", False) < 1e-6
    # alpha's weighted share of the 4 a second: 1 / (1 + 3), so one place ahead of it takes ~2 s
    assert pace.retry_after("alpha", False, ahead=1, fallback=9) == 2
    assert pace.retry_after("gamma", False, ahead=1, fallback=9) == 2  # never admitted: its share
    assert pace.retry_after("alpha", True, ahead=1, fallback=9) == 9  # no follow-up pace known
