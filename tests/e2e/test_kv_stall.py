"""A stalled KV-event feed is noticed and its hits are not routed on.

Worker A's KV events reach the router through frozen-able TCP proxies (a hung middlebox: the
connections stay open, nothing more is forwarded). The router is told A's URL as an HTTP front
that forwards everything to A and points /server_info's KV-event ports at the proxies. Then A's
cache is flushed behind the frozen feed: the router must drop A's view within seconds and not
send the session's follow-up `sticky` to a worker that holds none of it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.cluster.frozen_proxy import FrozenProxy
from tests.e2e.kvstack import Proc, start_router, start_worker, worker_probe
from tests.e2e.raw import generate, router_hits, token_ids, wait_indexed
from tests.helpers.polling import eventually

_HOP = {"content-length", "transfer-encoding", "connection", "content-encoding"}


class Front:
    """Forwards HTTP to `target`; /server_info names the proxies' ports for the KV events."""

    def __init__(self, target: str, pub: FrozenProxy, replay: FrozenProxy) -> None:
        self.target = target
        self._pub, self._replay = pub, replay
        self._ports: tuple[int, int] = (0, 0)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self.server = TestServer(app, host="127.0.0.1")
        self._http: aiohttp.ClientSession | None = None

    async def start(self) -> str:
        self._ports = (await self._pub.start(), await self._replay.start())
        self._http = aiohttp.ClientSession()
        await self.server.start_server()
        return f"http://127.0.0.1:{self.server.port}"

    async def close(self) -> None:
        await self.server.close()
        if self._http is not None:
            await self._http.close()
        await self._pub.close()
        await self._replay.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._http is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP | {"host"}}
        async with self._http.request(
            request.method,
            self.target + request.path_qs,
            headers=headers,
            data=await request.read(),
        ) as r:
            body = await r.read()
            if request.path in ("/server_info", "/get_server_info") and r.status == 200:
                info = await r.json()
                kv = info["kv_events"]
                kv["endpoint_port_base"], kv["replay_endpoint_port_base"] = self._ports
                return web.json_response(info)
            out = {k: v for k, v in r.headers.items() if k.lower() not in _HOP}
            return web.Response(status=r.status, body=body, headers=out)


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[Proc, Front, Proc, Proc]]:
    a = await start_worker()
    b = await start_worker()
    procs = [a, b]
    host, pub_port, replay_port = await _kv_ports(a.url)
    front = Front(a.url, FrozenProxy(host, pub_port), FrozenProxy(host, replay_port))
    try:
        front_url = await front.start()
        router = await start_router([front_url, b.url])
        procs.append(router)
        yield a, front, b, router
    finally:
        for p in reversed(procs):
            p.stop()
        await front.close()


async def _kv_ports(worker: str) -> tuple[str, int, int]:
    async with aiohttp.ClientSession() as http, http.get(f"{worker}/server_info") as r:
        kv = (await r.json())["kv_events"]
    return kv["endpoint_host"], kv["endpoint_port_base"], kv["replay_endpoint_port_base"]


async def test_follow_up_is_not_sticky_to_a_worker_whose_feed_stalled_behind_a_flush(
    cluster: tuple[Proc, Front, Proc, Proc],
) -> None:
    a, front, _b, router = cluster
    front_url = f"http://127.0.0.1:{front.server.port}"
    async with aiohttp.ClientSession() as http:
        # a session whose first turn lands on A (behind the front)
        for seed in range(20, 40):
            session = token_ids(seed=seed, n=1024)
            home, reason = await generate(http, router.url, session, {"x-smetric-turn": "0"})
            assert reason == "first-turn-balance"
            if home == front_url:
                break
        else:
            raise AssertionError("no first turn was balanced onto worker A")
        await wait_indexed(http, router.url, front_url, session)

        front._pub.freeze()
        front._replay.freeze()
        t0 = time.monotonic()
        async with http.post(f"{a.url}/flush_cache") as r:  # behind the router's back
            assert r.status == 200, await r.text()
        assert await worker_probe(http, a.url, session) == 0

        async def dropped() -> bool:
            return (await router_hits(http, router.url, session)).get(front_url, -1) == 0

        await eventually(dropped, "the stalled feed's view to be dropped", timeout=10)
        took = time.monotonic() - t0
        follow = session + token_ids(seed=99, n=64)
        hint = {"x-smetric-turn": "1", "x-smetric-history-tokens": str(len(session))}
        _, reason = await generate(http, router.url, follow, hint)
        assert reason != "sticky"
        assert reason == "evicted-fallback"
        print(f"stale view dropped {took:.1f} s after the freeze")
        assert took < 8.0
        async with http.get(f"{router.url}/workers") as r:
            listed = {w["url"]: w for w in (await r.json())["workers"]}
        assert listed[front_url]["kv_pages"] == {"gpu": 0, "host": 0}
        feed = listed[front_url]["kv_feed"]
        assert not feed["connected"] and feed["reconnects"] + feed["stalls"] >= 1, feed
        async with http.get(f"{router.url}/metrics") as r:
            assert f'smetric_kv_event_stalls_total{{worker="{front_url}"}}' in await r.text()
