"""Graceful shutdown: drain a router replica, then end what is still open.

On SIGTERM/SIGINT the router starts draining: /readiness answers 503 (a balancer takes the replica
out), new generation requests are refused with 503, and the open ones get `--shutdown-grace-secs`
to finish. Those still open then are ended: their handler task is cancelled after being marked
here, and the code it is cancelled in answers for it (copy_stream closes a stream with an SSE error
event, the generation handler answers a request without a response yet with 503). The marks are
per task, module-wide, so the stream copier needs no reference to the router's state.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

SHUTDOWN_CODE = "router_shutting_down"

# Tasks cancelled because the grace ran out (not because their client went away).
_ENDED: weakref.WeakSet[asyncio.Task[object]] = weakref.WeakSet()


def take_ended() -> bool:
    """Whether the current task was cancelled by a drain; if so, the cancellation is consumed
    (uncancelled and unmarked) so the caller can still write its last answer."""
    task = asyncio.current_task()
    if task is None or task not in _ENDED:
        return False
    _ENDED.discard(task)
    task.uncancel()
    return True


class Drain:
    """The open generation requests of one router, and whether it is draining."""

    def __init__(self) -> None:
        self.draining = False
        self._open: set[asyncio.Task[object]] = set()
        self._changed: asyncio.Event | None = None
        self._hurry = False

    @property
    def open(self) -> int:
        return len(self._open)

    @contextmanager
    def track(self, task: asyncio.Task[object] | None) -> Iterator[None]:
        """Count a generation request as open while the block runs."""
        if task is None:
            yield
            return
        self._open.add(task)
        try:
            yield
        finally:
            self._open.discard(task)
            self._notify()

    def begin(self) -> None:
        self.draining = True

    def hurry(self) -> None:
        """End the grace now (a second signal)."""
        self._hurry = True
        self._notify()

    async def wait_idle(self, timeout: float, *, can_hurry: bool = True) -> bool:
        """Wait until no request is open, at most `timeout` seconds (with can_hurry, less after
        hurry()); True if none is."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._open and not (can_hurry and self._hurry):
            left = deadline - loop.time()
            if left <= 0:
                break
            self._changed = asyncio.Event()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except asyncio.TimeoutError:
                break
        return not self._open

    def end_all(self) -> int:
        """Cancel every open request, marked as ended by the drain; how many there were."""
        for task in self._open:
            _ENDED.add(task)
            task.cancel()
        return len(self._open)

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
