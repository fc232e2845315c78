"""Worker admin, health, readiness, models, cache flush and metrics endpoints."""

from __future__ import annotations

from dataclasses import dataclass, field

import aiohttp

from smetric_router.core.types import RequestFeatures
from smetric_router.router.app import KV_WARM_WAIT_S
from tests.helpers.polling import eventually
from tests.router.conftest import MakeRouter, MakeWorker
from tests.router.fakes import free_port

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


async def test_workers_add_list_remove(make_worker: MakeWorker, make_router: MakeRouter) -> None:
    a, b = await make_worker("a"), await make_worker("b")
    odd = await make_worker("odd", page_size=64)
    router = await make_router([a.url])
    async with aiohttp.ClientSession() as s:
        async with s.post(router.url + "/workers", json={"url": b.url + "/"}) as resp:
            assert resp.status == 200
            assert (await resp.json())["worker"]["url"] == b.url
        async with s.post(router.url + "/workers", json={"url": b.url}) as resp:
            assert resp.status == 409
        async with s.post(router.url + "/workers", json={"url": odd.url}) as resp:
            assert resp.status == 400
            assert "page size" in (await resp.json())["error"]["message"]
        async with s.post(router.url + "/workers", json={"uri": b.url}) as resp:
            assert resp.status == 400
        async with s.get(router.url + "/workers") as resp:
            listed = (await resp.json())["workers"]
        assert [(w["url"], w["healthy"], w["inflight"]) for w in listed] == [
            (a.url, True, 0),
            (b.url, True, 0),
        ]
        assert listed[0]["page_size"] == 16 and listed[0]["models"] == ["fake-model"]

        async with s.delete(router.url + "/workers", params={"url": a.url}) as resp:
            assert resp.status == 200
        for _ in range(3):
            async with s.post(router.url + "/v1/chat/completions", json=CHAT) as resp:
                assert resp.headers["x-smetric-worker"] == b.url
        async with s.delete(router.url + "/workers", json={"url": b.url}) as resp:
            assert resp.status == 200
        async with s.delete(router.url + "/workers", json={"url": b.url}) as resp:
            assert resp.status == 404
        async with s.get(router.url + "/readiness") as resp:
            assert resp.status == 503
        async with s.post(router.url + "/v1/chat/completions", json=CHAT) as resp:
            assert resp.status == 503  # no worker is registered at all
            assert (await resp.json())["error"]["code"] == "no_worker_available"


async def test_health_checks_exclude_and_readmit(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    a, b = await make_worker("a"), await make_worker("b")
    router = await make_router([a.url, b.url], health_check_interval_secs=0.05)
    registry = router.state.registry
    a.healthy = False
    await eventually(lambda: not registry.workers[a.url].healthy, "a excluded by its health check")
    async with aiohttp.ClientSession() as s:
        for _ in range(4):
            async with s.post(router.url + "/v1/chat/completions", json=CHAT) as resp:
                assert resp.headers["x-smetric-worker"] == b.url
        b.healthy = False
        await eventually(lambda: not registry.healthy(), "no worker healthy")
        async with s.get(router.url + "/readiness") as resp:
            assert resp.status == 503
        async with s.get(router.url + "/health") as resp:
            assert resp.status == 200  # the router itself is alive
        a.healthy = True
        await eventually(lambda: registry.workers[a.url].healthy, "a healthy again")
        async with s.get(router.url + "/readiness") as resp:
            assert resp.status == 200
        async with s.post(router.url + "/v1/chat/completions", json=CHAT) as resp:
            assert resp.headers["x-smetric-worker"] == a.url


async def test_unreachable_start_worker_joins_when_it_comes_up(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    a = await make_worker("a")
    port = free_port()
    late_url = f"http://127.0.0.1:{port}"
    router = await make_router([a.url, late_url], health_check_interval_secs=0.05)
    registry = router.state.registry
    listed = registry.describe()
    assert [(w["url"], w["healthy"]) for w in listed] == [(a.url, True), (late_url, False)]
    async with aiohttp.ClientSession() as s:
        late_chat = {**CHAT, "model": "late-model"}
        async with s.post(router.url + "/v1/chat/completions", json=late_chat) as resp:
            # one model so far: like SGLang, the router routes any name (to a, whose fake
            # refuses names it does not serve)
            assert resp.status == 400 and resp.headers["x-smetric-worker"] == a.url

        late = await make_worker("late", model="late-model", port=port)
        assert late.url == late_url
        await eventually(lambda: registry.workers[late_url].healthy, "the late worker healthy")
        # Joined with what it reports: its model is routed to it, and only to it.
        assert registry.workers[late_url].models == {"late-model"}
        async with s.post(router.url + "/v1/chat/completions", json=late_chat) as resp:
            assert resp.status == 200
            assert resp.headers["x-smetric-worker"] == late_url
        async with s.get(router.url + "/workers") as resp:
            listed = (await resp.json())["workers"]
    assert [(w["url"], w["healthy"]) for w in listed] == [(a.url, True), (late_url, True)]
    assert len(late.bodies) == 1 and len(a.bodies) == 1  # a: the one before late joined


async def test_models_flush_and_metrics(make_worker: MakeWorker, make_router: MakeRouter) -> None:
    a, b = await make_worker("a"), await make_worker("b", model="other-model")
    router = await make_router([a.url, b.url])
    async with aiohttp.ClientSession() as s:
        async with s.get(router.url + "/v1/models") as resp:
            ids = [m["id"] for m in (await resp.json())["data"]]
        assert ids == ["fake-model", "other-model"]
        # A model is only routed to the workers that serve it.
        for model, url in (("fake-model", a.url), ("other-model", b.url)):
            async with s.post(
                router.url + "/v1/chat/completions", json={**CHAT, "model": model}
            ) as resp:
                assert resp.status == 200 and resp.headers["x-smetric-worker"] == url
        async with s.post(router.url + "/flush_cache") as resp:
            assert resp.status == 200
            results = (await resp.json())["results"]
        assert {u: r["status"] for u, r in results.items()} == {a.url: 200, b.url: 200}
        assert a.flushes == b.flushes == 1
        async with s.get(router.url + "/metrics") as resp:
            text = await resp.text()
    assert f'smetric_decisions_total{{reason="first-turn-balance",worker="{a.url}"}} 1.0' in text
    assert 'smetric_requests_total{endpoint="/v1/chat/completions",status="200"} 2.0' in text
    assert f'smetric_worker_healthy{{worker="{b.url}"}} 1.0' in text
    assert f'smetric_worker_inflight{{worker="{a.url}"}} 0.0' in text
    assert "smetric_ttft_seconds_count" in text and "smetric_request_duration_seconds" in text
    # each decision timed by stage; no cache probe nor global tier here, so no such stage
    for stage in ("body", "features", "decide"):
        assert f'smetric_decision_stage_seconds_count{{stage="{stage}"}} 2.0' in text
    assert 'stage="l3"' not in text and 'stage="cache_view"' not in text


async def test_reported_load_steers_balance(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    a, b = await make_worker("a"), await make_worker("b")
    a.running_reqs, a.waiting_reqs = 5, 2  # e.g. dispatched by another router replica
    router = await make_router([a.url, b.url], load_poll_interval_secs=0.05)
    registry = router.state.registry
    await eventually(lambda: registry.workers[a.url].reported_load == 7, "a's reported load")
    async with aiohttp.ClientSession() as s:
        for _ in range(3):
            async with s.post(router.url + "/v1/chat/completions", json=CHAT) as resp:
                assert resp.headers["x-smetric-worker"] == b.url
        async with s.get(router.url + "/workers") as resp:
            loads = {w["url"]: w["load"] for w in (await resp.json())["workers"]}
    assert loads[a.url] == 7.0


async def test_reported_running_batch_fills_the_view(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    a, b = await make_worker("a"), await make_worker("b")
    # a: idle batch, 7 queued; b: 3 running, none queued (both e.g. another replica's)
    a.running_reqs, a.waiting_reqs = 0, 7
    b.running_reqs, b.waiting_reqs = 3, 0
    router = await make_router([a.url, b.url], load_poll_interval_secs=0.05, policy="lmetric")
    registry = router.state.registry
    await eventually(
        lambda: registry.workers[b.url].reported_running == 3, "b's reported running requests"
    )
    await eventually(lambda: registry.workers[a.url].reported_load == 7, "a's reported load")
    features = RequestFeatures(prompt_len=100, page_hashes=(), page_size=16, turn=0, est_hit=0)
    view = router.state.router.snapshot(features, None)
    assert {v.url: (v.running, v.load) for v in view.workers} == {
        a.url: (0, 7.0),
        b.url: (3, 3.0),
    }
    async with aiohttp.ClientSession() as s:
        async with s.get(router.url + "/workers") as resp:
            running = {w["url"]: w["running"] for w in (await resp.json())["workers"]}
        assert running == {a.url: 0, b.url: 3}
        # the paper's LMetric: a's batch is empty (its queue does not count), so a scores 0
        async with s.post(router.url + "/v1/chat/completions", json=CHAT) as resp:
            assert resp.headers["x-smetric-worker"] == a.url
            assert resp.headers["x-smetric-reason"] == "lmetric"
    # a worker whose reports stop coming is unknown again, not idle
    registry.workers[a.url].reported_at -= 10 * registry.max_load_age
    view = router.state.router.snapshot(features, None)
    assert {v.url: v.running for v in view.workers} == {a.url: None, b.url: 3}


@dataclass
class _Feed:
    events_enabled: bool | None = True
    warmed: bool = False


@dataclass
class _Feeds:
    """The KV-event feeds as readiness reads them: each worker's events_enabled and warmed."""

    by_url: dict[str, _Feed] = field(default_factory=dict)

    def stats(self, url: str) -> _Feed | None:
        return self.by_url.get(url)

    async def stop(self) -> None:
        return None


async def test_readiness_waits_for_the_kv_views_warm_start_for_a_bounded_time(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    a, b = await make_worker("a"), await make_worker("b")
    router = await make_router([a.url, b.url])
    feeds = _Feeds({a.url: _Feed(warmed=True), b.url: _Feed(warmed=False)})
    router.state.kv_feeds = feeds  # type: ignore[assignment]

    async def readiness() -> tuple[int, dict[str, object]]:
        async with aiohttp.ClientSession() as s, s.get(router.url + "/readiness") as resp:
            return resp.status, await resp.json()

    assert await readiness() == (
        503, {"status": "warming KV views", "healthy_workers": 2, "warming_workers": 1}
    )  # fmt: skip
    feeds.by_url[b.url].warmed = True
    assert await readiness() == (200, {"status": "ready", "healthy_workers": 2})
    # a worker without KV events has no view to warm
    feeds.by_url[b.url] = _Feed(events_enabled=False)
    assert (await readiness())[0] == 200
    # a feed that never warms keeps the replica out only for a while after its start
    feeds.by_url[b.url] = _Feed(warmed=False)
    assert (await readiness())[0] == 503
    router.state.started_at -= KV_WARM_WAIT_S + 1
    assert await readiness() == (200, {"status": "ready", "healthy_workers": 2})
