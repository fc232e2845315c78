"""The tests' polling helpers (tests/helpers/polling.py): they return the first truthy value of a
plain or async check, and fail past the timeout naming what they waited for and its last value."""

from __future__ import annotations

import itertools
import time

import pytest

from tests.helpers.polling import eventually, eventually_sync


async def test_eventually_returns_the_first_truthy_value_of_a_plain_or_async_check() -> None:
    counts = itertools.count()
    assert await eventually(lambda: next(counts) >= 3 and "ready", "three checks") == "ready"

    polled = itertools.count()

    async def probe() -> dict[str, int]:
        n = next(polled)
        return {"n": n} if n >= 2 else {}

    assert await eventually(probe, "a probe's answer") == {"n": 2}


async def test_eventually_fails_naming_what_and_the_last_value() -> None:
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"not within 0.2 s: the moon \(last: \[\]\)"):
        await eventually(lambda: [], "the moon", timeout=0.2)
    assert 0.2 <= time.monotonic() - started < 2


async def test_an_error_in_the_check_is_not_retried() -> None:
    def check() -> bool:
        raise RuntimeError("the worker exited")

    with pytest.raises(RuntimeError, match="the worker exited"):
        await eventually(check, "anything")


def test_eventually_sync_polls_the_same_way() -> None:
    counts = itertools.count()
    assert eventually_sync(lambda: next(counts) == 3, "three checks") is True
    with pytest.raises(AssertionError, match=r"not within 0.1 s: nothing \(last: 0\)"):
        eventually_sync(lambda: 0, "nothing", timeout=0.1)
