"""Background tasks a component owns."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable


async def cancel_and_wait(tasks: Iterable[asyncio.Task[None]]) -> None:
    """Cancel them all, then wait for each to end (its cancellation swallowed)."""
    tasks = list(tasks)
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await t
