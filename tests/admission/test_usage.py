"""A tenant's use of the admission slots on a hand-moved clock: the count now, its recent
average when that is higher, and tenants forgotten once idle."""

from __future__ import annotations

import math

import pytest

from smetric_router.admission.usage import SlotUse
from tests.helpers.clock import FakeClock


def test_use_is_the_running_count_once_steady() -> None:
    clock = FakeClock()
    use = SlotUse(clock, window_s=10.0)
    for _ in range(3):
        use.start("a")
    clock.advance(1000.0)
    assert use.snapshot() == pytest.approx({"a": 3.0})
    assert use.running("a") == 3


def test_a_tenant_that_just_ran_more_keeps_its_recent_average() -> None:
    clock = FakeClock()
    use = SlotUse(clock, window_s=10.0)
    for _ in range(8):
        use.start("a")
    clock.advance(1000.0)
    for _ in range(6):
        use.end("a")
    # 2 running now, but 8 for a long while: one window later the average is 2 + 6/e
    clock.advance(10.0)
    assert use.snapshot()["a"] == pytest.approx(2 + 6 / math.e)
    assert use.running("a") == 2


def test_a_tenant_that_just_arrived_counts_what_it_runs() -> None:
    clock = FakeClock()
    use = SlotUse(clock, window_s=10.0)
    for _ in range(5):
        use.start("new")
    # its average is still near 0; its use is what it holds now
    assert use.snapshot() == {"new": 5.0}


def test_an_idle_tenant_is_forgotten() -> None:
    clock = FakeClock()
    use = SlotUse(clock, window_s=1.0)
    use.start("a")
    clock.advance(5.0)
    use.end("a")
    assert len(use) == 1
    clock.advance(100.0)
    assert use.snapshot() == {} and len(use) == 0


def test_ending_what_never_started_is_an_error() -> None:
    use = SlotUse(FakeClock())
    with pytest.raises(ValueError, match="no running request"):
        use.end("ghost")


def test_window_zero_is_the_count_alone() -> None:
    clock = FakeClock()
    use = SlotUse(clock, window_s=0.0)
    use.start("a")
    use.start("a")
    clock.advance(0.5)
    use.end("a")
    clock.advance(0.001)
    assert use.snapshot() == {"a": 1.0}
