"""The /dashboard page and its data without a running cluster: the sampler's ring buffer, and the
page laid out for 64 workers (a built registry of fake workers; the page and data served by the
router's own handlers) in headless Chromium."""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from smetric_router.router.auth import Access, access_of
from smetric_router.router.dashboard import Sampler, data_handler, handle_page, page
from smetric_router.router.metrics import WorkerSample
from tests.monitoring.live import chromium, heatmap_spread
from tests.monitoring.tools import require_chromium


class FakeCluster:
    """Workers whose load follows a wave per worker; counts the sampler reads."""

    def __init__(self, n: int) -> None:
        self.urls = [f"http://10.0.{i // 250}.{i % 250 + 1}:30000" for i in range(n)]
        self.t = 0
        self.decisions: dict[str, int] = {}
        self.tiers: dict[str, int] = {}
        self.batches = 0

    def workers(self) -> list[WorkerSample]:
        return [
            WorkerSample(url, healthy=i % 17 != 3, inflight=i % 5,
                         load=4 + 4 * math.sin(self.t / 9 + i / 3), kv_connected=i % 13 != 5,
                         kv_resets=i % 3, inflight_pages=i)
            for i, url in enumerate(self.urls)
        ]  # fmt: skip

    def advance(self) -> None:
        self.t += 1
        self.batches += 1
        for reason, n in (("sticky", 7), ("first-turn-balance", 2), ("overload-fallback", 1)):
            self.decisions[reason] = self.decisions.get(reason, 0) + n
        self.tiers["gpu"] = self.tiers.get("gpu", 0) + 900
        self.tiers["host"] = self.tiers.get("host", 0) + 300


def sampler_of(cluster: FakeCluster, history_s: int = 300) -> Sampler:
    return Sampler(cluster.workers, cluster.decisions, cluster.tiers,
                   feed_batches=lambda _u: cluster.batches, history_s=history_s)  # fmt: skip


def test_the_ring_buffer_keeps_the_last_seconds_and_deltas() -> None:
    cluster = FakeCluster(4)
    sampler = sampler_of(cluster, history_s=10)
    for s in range(25):
        cluster.advance()
        sampler.tick(now=1000.0 + s, mono=float(s))
    data = sampler.data(mono=24.0)
    h = data["history"]
    assert h["t"] == [1015.0 + s for s in range(10)]  # bounded: the last 10 only
    assert h["workers"] == sorted(cluster.urls)
    assert all(len(row) == 10 for row in h["load"])
    assert h["decisions"][-1] == {"sticky": 7, "first-turn-balance": 2, "overload-fallback": 1}
    assert h["tiers"][-1] == {"gpu": 900, "host": 300}
    assert data["workers"][0]["kv"]["last_batch_age_s"] == 0.0
    assert sampler.data(seconds=3)["history"]["t"] == [1022.0, 1023.0, 1024.0]


def test_a_worker_that_comes_and_goes_has_gaps() -> None:
    cluster = FakeCluster(2)
    sampler = sampler_of(cluster)
    sampler.tick(now=1.0, mono=1.0)
    cluster.urls.append("http://10.9.9.9:30000")
    sampler.tick(now=2.0, mono=2.0)
    h = sampler.data(mono=2.0)["history"]
    new = h["workers"].index("http://10.9.9.9:30000")
    assert h["load"][new][0] is None and h["load"][new][1] is not None


def test_the_page_is_self_contained() -> None:
    html = page().decode()
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", html)
    assert "@import" not in html and "url(" not in html and "@font-face" not in html
    assert "/dashboard/data" in html and "Authorization" in html


def test_the_page_is_open_and_its_data_admin() -> None:
    assert access_of("GET", "/dashboard") is Access.OPEN
    assert access_of("GET", "/dashboard/data") is Access.ADMIN


@pytest.fixture(scope="module")
def served_64(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """/dashboard and /dashboard/data for 64 fake workers and 3 minutes of history, served by
    the router's handlers on a thread's event loop."""
    import threading

    require_chromium()
    cluster = FakeCluster(64)
    sampler = sampler_of(cluster)
    for s in range(180):
        cluster.advance()
        sampler.tick(now=1_800_000_000.0 + s, mono=float(s))
    app = web.Application()
    app.router.add_get("/dashboard", handle_page)
    app.router.add_get("/dashboard/data", data_handler(lambda _r: sampler))
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def test_64_workers_lay_out(served_64: str, tmp_path: Path) -> None:
    shot = tmp_path / "dashboard-64.png"
    dom = chromium(served_64 + "/dashboard", tmp_path, screenshot=shot)
    rows = re.findall(r"<tr><td title=\"(http://[^\"]+)\">", dom)
    assert len(rows) == 64
    assert "64 workers (60 healthy)" in dom
    spread, colours = heatmap_spread(shot)
    assert spread > 10 and colours > 8, (spread, colours)
