"""Wait for a condition by polling it: `eventually` in async tests, `eventually_sync` in sync ones.

Both call `check` until it returns something truthy and return that, so a probe can hand back
what it found. The pause between checks starts at 10 ms and doubles up to `interval`: a state
that changes at once is seen at once, and a slow one over HTTP is not asked 100 times a second.
Past `timeout` (20 s unless given: room for a stack of processes on a busy machine) they fail
with an AssertionError that names `what` and the last value seen.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")

FIRST_PAUSE_S = 0.01


class _Polls:
    """The schedule both share: when to give up, and how long to pause before the next check."""

    def __init__(self, what: str, timeout: float, interval: float) -> None:
        self.what, self.timeout, self.interval = what, timeout, interval
        self.deadline = time.monotonic() + timeout
        self.pause = min(FIRST_PAUSE_S, interval)

    def next_pause(self, last: object) -> float:
        if time.monotonic() > self.deadline:
            raise AssertionError(f"not within {self.timeout:g} s: {self.what} (last: {last!r})")
        pause, self.pause = self.pause, min(2 * self.pause, self.interval)
        return pause


@overload
async def eventually(
    check: Callable[[], Awaitable[T | None]], what: str, timeout: float = ..., interval: float = ...
) -> T: ...
@overload
async def eventually(
    check: Callable[[], T | None], what: str, timeout: float = ..., interval: float = ...
) -> T: ...
async def eventually(
    check: Callable[[], object], what: str, timeout: float = 20.0, interval: float = 0.1
) -> object:
    """Await `check()` (a plain function or a coroutine function) until it is truthy; return it."""
    polls = _Polls(what, timeout, interval)
    while True:
        got = check()
        value = await got if inspect.isawaitable(got) else got
        if value:
            return value
        await asyncio.sleep(polls.next_pause(value))


def eventually_sync(
    check: Callable[[], T | None], what: str, timeout: float = 20.0, interval: float = 0.1
) -> T:
    """`eventually` for sync tests: blocks between checks."""
    polls = _Polls(what, timeout, interval)
    while not (value := check()):
        time.sleep(polls.next_pause(value))
    return value
