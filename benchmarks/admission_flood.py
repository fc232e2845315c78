"""The flood check: thousands of requests waiting in the admission queue at once, their clients
going away while they wait, then the router's memory and whether it still serves.

Each flood client sends a streamed chat completion; once the round's requests wait in the queue,
each disconnects after a random time (uniform over `hold_s`) unless its answer came first. RSS
is read from /proc for the router's process.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp

from benchmarks.soak import rss_mb
from smetric_router.core.prometheus import readable_samples, total

SAMPLE_S = 0.5
# Longest wait for a round's requests to reach the queue before its clients start leaving: the
# router's listen backlog is far smaller than a flood, so the kernel lets connections in over
# several SYN retries.
RAMP_S = 60.0


@dataclass
class FloodResult:
    requests: int  # per round
    rss_before_mb: float
    rss_peak_mb: float
    rss_after_mb: list[float]  # after each round
    queued_peak: float  # smetric_admission_queued at its highest sample
    queued_after: float
    running_after: float
    outcomes: dict[str, int] = field(default_factory=dict)  # ok | shed | disconnected | error
    served_after: bool = False  # a chat completion answered 200 after the flood
    seconds: float = 0.0

    @property
    def bounded(self) -> bool:
        """A later round grew RSS by under a tenth of what the first did (5 MiB at least): the
        memory a flood takes is reused by the next, not added to."""
        first = self.rss_after_mb[0] - self.rss_before_mb
        later = self.rss_after_mb[-1] - self.rss_after_mb[0]
        return later < max(5.0, first / 10)


async def _gauges(http: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    async with http.get(f"{url}/metrics") as r:
        found = readable_samples(await r.text())
    return total(found, "smetric_admission_queued"), total(found, "smetric_admission_running")


async def _one(http: aiohttp.ClientSession, url: str, body: dict[str, object],
               headers: dict[str, str], leave: asyncio.Event, delay_s: float,
               tally: Counter[str]) -> None:  # fmt: skip
    """One flood client: it sends, and once `leave` is set it waits delay_s more for its answer
    before it disconnects."""

    async def send() -> str:
        async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r:
            if r.status == 429:
                await r.read()
                return "shed"
            if r.status != 200:
                return "error"
            async for _ in r.content:
                pass
            return "ok"

    req = asyncio.create_task(send())
    told = asyncio.create_task(leave.wait())
    await asyncio.wait({req, told}, return_when=asyncio.FIRST_COMPLETED)
    told.cancel()
    if not req.done():
        await asyncio.wait({req}, timeout=delay_s)
    if not req.done():
        req.cancel()
        with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
            await req
        tally["disconnected"] += 1
    elif req.exception() is not None:
        tally["error"] += 1
    else:
        tally[req.result()] += 1


async def flood(url: str, pid: int, model: str, key: str, n: int, hold_s: float,
                rounds: int = 2, ramp_s: float = RAMP_S, max_tokens: int = 64,
                seed: int = 1) -> FloodResult:  # fmt: skip
    """`rounds` times n requests at once against the router at `url` (process `pid`); once 95 %
    of them wait in its queue (or ramp_s has passed) the clients leave at random over hold_s;
    then the router's gauges, its RSS and one more request."""
    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {key}"}
    messages = [{"role": "user", "content": "flood " * 64}]
    body: dict[str, object] = {"model": model, "max_tokens": max_tokens, "stream": True,
                               "ignore_eos": True, "messages": messages}  # fmt: skip
    tally: Counter[str] = Counter()
    before = rss_mb(pid)
    peak, queued_peak, after = before, 0.0, []
    t0 = time.monotonic()
    async with aiohttp.ClientSession() as probe:
        for _ in range(rounds):
            leave = asyncio.Event()
            conn = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=conn) as http:
                tasks = [asyncio.create_task(_one(http, url, body, headers, leave,
                                                  rng.uniform(0.0, hold_s), tally))
                         for _ in range(n)]  # fmt: skip
                ramp = time.monotonic() + ramp_s
                while not all(t.done() for t in tasks):
                    await asyncio.sleep(SAMPLE_S)
                    peak = max(peak, rss_mb(pid))
                    with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                        queued = (await _gauges(probe, url))[0]
                        queued_peak = max(queued_peak, queued)
                        # the clients start leaving once the flood is in (or the ramp is over)
                        if queued >= 0.95 * n:
                            leave.set()
                    if time.monotonic() > ramp:
                        leave.set()
            await asyncio.sleep(3.0)  # the router lets go of what the last clients left
            after.append(rss_mb(pid))
        seconds = time.monotonic() - t0
        queued, running = await _gauges(probe, url)
        small = {**body, "stream": False, "max_tokens": 4}
        async with probe.post(f"{url}/v1/chat/completions", json=small, headers=headers) as r:
            served = r.status == 200
    return FloodResult(n, before, peak, after, queued_peak, queued, running, dict(tally), served,
                       seconds)  # fmt: skip
