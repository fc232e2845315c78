"""The rules, the Grafana dashboard and the /dashboard page against a real router: emulated
workers and a router (with an admin key and an L3 view from KV events) as processes, a real
Prometheus scraping it every second with deploy/monitoring's rules loaded, and headless Chromium
opening /dashboard, after a short burst of chat sessions."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from smetric_router.launch import ClusterSpec, RouterSpec, Stack, WorkerSpec
from tests.e2e.conftest import ROUTER_ARGS
from tests.helpers.polling import eventually_sync
from tests.monitoring.live import (
    busy,
    chromium,
    heatmap_spread,
    prometheus,
    query_range,
    sessions,
)
from tests.monitoring.tools import panel_queries, recording_names, require_tool, substitute

ADMIN = "admin-key-dash"
WORKERS = 4
SPEEDUP = 2.0  # slow enough that load stays visible for a few seconds


@dataclass
class Live:
    stack: Stack
    prometheus: str
    start: float
    tmp: Path


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    require_tool("prometheus")
    require_tool("promtool")
    tmp = tmp_path_factory.mktemp("live")
    spec = ClusterSpec(
        router=RouterSpec(
            port=0, extra_args=(*ROUTER_ARGS, "--admin-api-key", ADMIN, "--l3-view", "events")
        ),
        workers=WorkerSpec(count=WORKERS, speedup=SPEEDUP),
    )
    with Stack(spec) as stack:
        target = stack.url.removeprefix("http://")
        with prometheus(target, tmp) as prom:
            start = time.time()
            eventually_sync(lambda: query_range(prom, "up == 1", start - 5, time.time()),
                            "Prometheus scraped the router", timeout=30)  # fmt: skip
            asyncio.run(sessions(stack.url, spec.workers.model_name, count=12, turns=4))
            print(f"traffic: {time.time() - start:.1f} s")
            time.sleep(2.0)  # a couple more scrapes and rule evaluations
            yield Live(stack, prom, start - 2, tmp)


def _message(dom: str) -> str:
    """The page's error line."""
    found = re.search(r'<span id="msg">(.*?)</span>', dom)
    assert found is not None, dom[-2000:]
    return found.group(1)


def _answers(live: Live, exprs: list[str]) -> dict[str, bool]:
    end = time.time()
    return {e: bool(query_range(live.prometheus, e, live.start, end)) for e in exprs}


def test_every_recording_rule_and_panel_query_returns_data(live: Live) -> None:
    exprs = list(dict.fromkeys([*recording_names(), *(substitute(e) for _, e in panel_queries())]))
    last: dict[str, bool] = {}

    def all_answered() -> bool:
        last.update(_answers(live, [e for e in exprs if not last.get(e)]))
        return all(last.values())

    try:
        with busy(live.stack.url, live.stack.spec.workers.model_name):
            eventually_sync(all_answered, "every rule and panel query answered", timeout=30)
    except AssertionError:
        raise AssertionError(f"no data: {[e for e, ok in last.items() if not ok]}") from None


def test_the_dashboard_page_shows_every_worker_and_a_heatmap(live: Live) -> None:
    shot = live.tmp / "dashboard.png"
    dom = chromium(f"{live.stack.url}/dashboard#key={ADMIN}", live.tmp, screenshot=shot)
    for url in live.stack.worker_urls:
        assert url.removeprefix("http://") in dom, url
    assert _message(dom) == ""
    assert ADMIN not in dom  # the key left the address bar and the page
    spread, colours = heatmap_spread(shot)
    assert spread > 10 and colours > 3, (spread, colours)


def test_without_the_key_the_page_shows_no_data(live: Live) -> None:
    dom = chromium(f"{live.stack.url}/dashboard", live.tmp / "nokey", budget_ms=2000)
    assert "needs the admin key" in _message(dom)
    assert not any(url.removeprefix("http://") in dom for url in live.stack.worker_urls)


async def test_the_data_endpoint_is_admin_only(live: Live) -> None:
    url = live.stack.url
    async with aiohttp.ClientSession() as http:
        async with http.get(url + "/dashboard") as r:  # the static page: open
            assert r.status == 200 and r.content_type == "text/html"
        async with http.get(url + "/dashboard/data") as r:
            assert r.status == 401
        async with http.get(url + "/dashboard/data", headers={"Authorization": "Bearer no"}) as r:
            assert r.status == 403
        auth = {"Authorization": f"Bearer {ADMIN}"}
        async with http.get(url + "/dashboard/data", headers=auth) as r:
            assert r.status == 200
            data = await r.json()
    assert sorted(w["url"] for w in data["workers"]) == sorted(live.stack.worker_urls)
    assert sum(sum(d.values()) for d in data["history"]["decisions"]) >= 12 * 4
    assert data["l3"]["source"] == "events"
