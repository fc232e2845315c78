"""GET /dashboard: a live page of the router's view (workers, decisions, the per-worker load
heatmap of the SMetric paper's Fig 15b), and GET /dashboard/data, the JSON it polls each second.

The page is static HTML with its script and styles inline (smetric_router/assets/dashboard.html,
no CDN, no fonts): it holds no data and is open like /metrics. Its data endpoint is an admin
endpoint (router/auth.py): the admin key as 'Authorization: Bearer KEY', or, with no key
configured, loopback clients only. The page reads the key from its URL fragment
(/dashboard#key=KEY, which a browser never sends to a server) and sends it on its fetches.

A timer samples the router once a second into a ring buffer of `HISTORY_S` samples (bounded
memory: per sample one float per worker and a few counters), so a poll costs one JSON dump and
nothing on the request path changes: the decision and prefix counts are plain ints the metrics
keep beside their Prometheus counters. The timer's lateness is the event loop's lag, exported as
smetric_router_event_loop_lag_seconds (a saturated router is late to everything).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from aiohttp import web

from smetric_router.router.metrics import L3Sample, WorkerSample

HISTORY_S = 300  # seconds of per-second samples kept
PERIOD_S = 1.0
PAGE = "dashboard.html"


@dataclass(frozen=True, slots=True)
class Tick:
    """One second of the router: when, each worker's load then, and what happened since the
    previous tick (decisions by reason, routed prefix tokens by tier)."""

    t: float  # wall clock (time.time())
    load: Mapping[str, float]
    decisions: Mapping[str, int]
    tiers: Mapping[str, int]


@dataclass(slots=True)
class _FeedSeen:
    batches: int = -1
    since: float = 0.0  # monotonic time the batch count last moved


@dataclass(slots=True)
class Sampler:
    """The ring buffer and what it is filled from. `tick` is called by the timer (and by tests
    with a clock of their own)."""

    sample_workers: Callable[[], Iterable[WorkerSample]]
    decision_counts: Mapping[str, int]  # cumulative, by reason (RouterMetrics keeps them)
    tier_counts: Mapping[str, int]  # cumulative routed prefix tokens, by tier
    sample_l3: Callable[[], L3Sample | None] = lambda: None
    feed_batches: Callable[[str], int | None] = lambda _url: None
    history_s: int = HISTORY_S
    ticks: deque[Tick] = field(init=False)
    loop_lag_s: float = 0.0
    _last_decisions: dict[str, int] = field(default_factory=dict)
    _last_tiers: dict[str, int] = field(default_factory=dict)
    _feeds: dict[str, _FeedSeen] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ticks = deque(maxlen=self.history_s)

    def tick(self, now: float | None = None, mono: float | None = None) -> None:
        now = time.time() if now is None else now
        mono = time.monotonic() if mono is None else mono
        workers = list(self.sample_workers())
        load = {w.url: w.load for w in workers}
        decisions = _delta(self.decision_counts, self._last_decisions)
        tiers = _delta(self.tier_counts, self._last_tiers)
        self.ticks.append(Tick(now, load, decisions, tiers))
        for w in workers:
            n = self.feed_batches(w.url)
            seen = self._feeds.setdefault(w.url, _FeedSeen(since=mono))
            if n is not None and n != seen.batches:
                seen.batches, seen.since = n, mono
        for gone in self._feeds.keys() - load.keys():
            del self._feeds[gone]

    def data(self, seconds: int = HISTORY_S, mono: float | None = None) -> dict[str, Any]:
        """What the page draws: the workers now, and the last `seconds` of history."""
        mono = time.monotonic() if mono is None else mono
        ticks = list(self.ticks)[-max(1, seconds) :]
        workers = sorted(self.sample_workers(), key=lambda w: w.url)
        urls = [w.url for w in workers]
        rows = []
        for w in workers:
            seen = self._feeds.get(w.url)
            rows.append(
                {
                    "url": w.url,
                    "healthy": w.healthy,
                    "load": w.load,
                    "inflight": w.inflight,
                    "inflight_pages": w.inflight_pages,
                    "kv": None
                    if w.kv_connected is None
                    else {
                        "connected": w.kv_connected,
                        "resets": w.kv_resets,
                        "stalls": w.kv_stalls,
                        "gaps_recovered": w.kv_gaps_recovered,
                        "decode_errors": w.kv_decode_errors,
                        # seconds since the feed last applied a batch (as this timer saw it)
                        "last_batch_age_s": None
                        if seen is None or seen.batches < 0
                        else round(mono - seen.since, 1),
                    },
                }
            )
        l3 = self.sample_l3()
        return {
            "now": time.time(),
            "pid": os.getpid(),
            "period_s": PERIOD_S,
            "loop_lag_s": self.loop_lag_s,
            "workers": rows,
            "l3": None
            if l3 is None
            else {
                "source": l3.source,
                "known": l3.ok,
                "outages": l3.outages,
                "resets": l3.resets,
                "lookups": l3.lookups,
                "keys": l3.keys,
                "pages": l3.pages,
            },
            "history": {
                "t": [round(k.t, 3) for k in ticks],
                "workers": urls,
                # load[i][j]: worker urls[i] at t[j]; null where it was not registered
                "load": [[k.load.get(u) for k in ticks] for u in urls],
                "decisions": [dict(k.decisions) for k in ticks],
                "tiers": [dict(k.tiers) for k in ticks],
            },
        }


def _delta(total: Mapping[str, int], last: dict[str, int]) -> dict[str, int]:
    out = {}
    for key, n in list(total.items()):
        d = n - last.get(key, 0)
        if d:
            out[key] = d
        last[key] = n
    return out


class SamplerTimer:
    """Calls `sampler.tick` once a period on the event loop; measures how late each call came."""

    def __init__(self, sampler: Sampler, on_lag: Callable[[float], None], period: float = PERIOD_S):
        self._sampler, self._on_lag, self._period = sampler, on_lag, period
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + self._period
        while True:
            await asyncio.sleep(max(0.0, due - loop.time()))
            lag = max(0.0, loop.time() - due)
            self._sampler.loop_lag_s = lag
            self._on_lag(lag)
            self._sampler.tick()
            due += self._period
            if due < loop.time():  # far behind (a suspended process): do not catch up in a burst
                due = loop.time() + self._period


_page: bytes | None = None


def page() -> bytes:
    global _page
    if _page is None:
        _page = resources.files("smetric_router").joinpath("assets", PAGE).read_bytes()
    return _page


async def handle_page(_: web.Request) -> web.Response:
    return web.Response(
        body=page(),
        content_type="text/html",
        charset="utf-8",
        headers={
            # the page loads nothing from anywhere: no script, style or font of another origin
            "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
            "style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; "
            "frame-ancestors 'none'",
            "Cache-Control": "no-cache",
            "Referrer-Policy": "no-referrer",
        },
    )


def data_handler(sampler: Callable[[web.Request], Sampler]) -> Callable[[web.Request], Any]:
    async def handle_data(request: web.Request) -> web.Response:
        try:
            seconds = int(request.query.get("seconds", HISTORY_S))
        except ValueError:
            seconds = HISTORY_S
        body = sampler(request).data(min(max(seconds, 1), HISTORY_S))
        return web.json_response(body, headers={"Cache-Control": "no-store"})

    return handle_data
