"""The drain registry (router/drain.py): open requests, the grace, and ending the rest."""

from __future__ import annotations

import asyncio

from smetric_router.router.drain import Drain, take_ended


async def _request(drain: Drain, release: asyncio.Event, outcome: list[str]) -> None:
    with drain.track(asyncio.current_task()):
        try:
            await release.wait()
            outcome.append("finished")
        except asyncio.CancelledError:
            if not take_ended():
                outcome.append("cancelled")
                raise
            outcome.append("ended")
            await asyncio.sleep(0)  # still usable: the drain's cancellation was consumed


async def test_wait_idle_returns_when_the_last_request_finishes() -> None:
    drain, release = Drain(), asyncio.Event()
    outcome: list[str] = []
    task = asyncio.create_task(_request(drain, release, outcome))
    await asyncio.sleep(0)
    assert drain.open == 1
    assert not await drain.wait_idle(0.05)  # still open after that grace
    asyncio.get_running_loop().call_later(0.05, release.set)
    assert await asyncio.wait_for(drain.wait_idle(10), 5)
    await task
    assert outcome == ["finished"] and drain.open == 0


async def test_end_all_marks_the_cancellation_so_the_request_answers() -> None:
    drain, release = Drain(), asyncio.Event()
    outcome: list[str] = []
    ended = asyncio.create_task(_request(drain, release, outcome))
    await asyncio.sleep(0)
    assert drain.end_all() == 1
    assert await drain.wait_idle(5, can_hurry=False)
    await ended  # returned normally
    assert outcome == ["ended"]
    # a request cancelled for another reason (its client went away) is not taken for ended
    other = asyncio.create_task(_request(drain, release, outcome))
    await asyncio.sleep(0)
    other.cancel()
    await asyncio.gather(other, return_exceptions=True)
    assert other.cancelled() and outcome[-1] == "cancelled"


async def test_hurry_ends_the_grace_at_once() -> None:
    drain, release = Drain(), asyncio.Event()
    outcome: list[str] = []
    task = asyncio.create_task(_request(drain, release, outcome))
    await asyncio.sleep(0)
    asyncio.get_running_loop().call_later(0.05, drain.hurry)
    assert not await asyncio.wait_for(drain.wait_idle(60), 5)
    drain.end_all()
    await task
    assert outcome == ["ended"]
