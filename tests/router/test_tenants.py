"""Tenants through the router's HTTP surface (--api-key-file), in front of fake workers: a tenant
over its requests per minute gets 429 with Retry-After in each API's shape while another is
served, its bucket refills on the (hand-moved) clock, `priority` reaches the worker as sent and
orders the tenant's requests in the router queue, max_priority caps it, and the metrics and the
x-smetric-tenant header name the tenant, never its key."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from smetric_router.admission.buckets import RateLimiter
from tests.helpers.clock import FakeClock
from tests.helpers.polling import eventually
from tests.helpers.prometheus import total, value
from tests.router.conftest import MakeRouter, MakeWorker, RouterUnderTest

SMALL, BIG, CAPPED = "sk-small-key", "sk-big-key", "sk-capped-key"
KEYS = f"""
tenants:
  - {{name: small, key: {SMALL}, requests_per_minute: 1}}
  - {{name: big, key_env: BIG_TENANT_KEY, weight: 3}}
  - {{name: capped, key: {CAPPED}, max_priority: 5}}
"""
CHAT: dict[str, Any] = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": CHAT,
    "/v1/messages": {"model": "fake-model", "max_tokens": 8,
                     "messages": [{"role": "user", "content": "hi"}]},
    "/v1/responses": {"model": "fake-model", "input": "hi", "store": False},
}  # fmt: skip


@pytest.fixture
def key_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("BIG_TENANT_KEY", BIG)
    path = tmp_path / "keys.yaml"
    path.write_text(KEYS)
    return str(path)


def on_clock(router: RouterUnderTest) -> FakeClock:
    """The router's buckets on a clock the test moves."""
    clock = FakeClock()
    assert router.state.tenants is not None
    router.state.limits = RateLimiter(router.state.tenants.limits(), clock)
    return clock


def key(k: str, path: str = "/v1/chat/completions") -> dict[str, str]:
    return {"x-api-key": k} if path == "/v1/messages" else {"Authorization": f"Bearer {k}"}


async def post(
    http: aiohttp.ClientSession, url: str, k: str, body: dict[str, Any] | None = None
) -> tuple[int, dict[str, str], Any]:
    path = "/" + url.split("/", 3)[3]
    async with http.post(url, json=body or BODIES[path], headers=key(k, path)) as r:
        return r.status, dict(r.headers), await r.json()


async def test_a_tenant_over_its_rate_gets_429_in_each_shape_and_others_are_served(
    make_worker: MakeWorker, make_router: MakeRouter, key_file: str
) -> None:
    w = await make_worker()
    router = await make_router([w.url], api_key_file=key_file)
    clock = on_clock(router)
    chat = router.url + "/v1/chat/completions"
    async with aiohttp.ClientSession() as http:
        status, headers, _ = await post(http, chat, SMALL)
        assert status == 200 and headers["x-smetric-tenant"] == "small"
        for path in BODIES:
            status, headers, body = await post(http, router.url + path, SMALL)
            assert status == 429, (path, body)
            assert headers["Retry-After"] == "60"  # one request a minute, just spent
            assert headers["x-smetric-shed"] == "rate_limit"
            assert headers["x-smetric-tenant"] == "small"
            if path == "/v1/messages":
                assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
                message = body["error"]["message"]
            else:
                assert body["error"]["code"] == "rate_limit_exceeded"
                assert body["error"]["type"] == "requests"
                message = body["error"]["message"]
            assert "small" in message and "1 requests per minute" in message
            assert SMALL not in message
        # another tenant is not affected
        for _ in range(3):
            status, headers, _ = await post(http, chat, BIG)
            assert status == 200 and headers["x-smetric-tenant"] == "big"
        clock.advance(45)
        status, headers, _ = await post(http, chat, SMALL)
        assert status == 429 and headers["Retry-After"] == "15"
        clock.advance(15)
        assert (await post(http, chat, SMALL))[0] == 200
        async with http.get(router.url + "/metrics") as r:
            text = await r.text()
    assert total(text, "smetric_admission_shed_total", reason="rate_limit", tenant="small") == 4
    assert total(text, "smetric_admission_shed_total", tenant="big") == 0
    assert total(text, "smetric_admission_admitted_total", tenant="big") == 3
    assert total(text, "smetric_admission_admitted_total", tenant="small") == 2
    assert SMALL not in text and BIG not in text
    assert len(w.bodies) == 5


async def test_unknown_or_missing_keys_are_401(
    make_worker: MakeWorker, make_router: MakeRouter, key_file: str
) -> None:
    w = await make_worker()
    router = await make_router([w.url], api_key_file=key_file)
    async with aiohttp.ClientSession() as http:
        status, headers, body = await post(http, router.url + "/v1/chat/completions", "nope")
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        assert "x-smetric-tenant" not in headers
        async with http.post(router.url + "/v1/chat/completions", json=CHAT) as r:
            assert r.status == 401
    assert w.bodies == []


async def test_the_api_key_is_tenant_default_beside_the_file(
    make_worker: MakeWorker, make_router: MakeRouter, key_file: str
) -> None:
    w = await make_worker()
    router = await make_router([w.url], api_key_file=key_file, api_key="sk-plain")
    async with aiohttp.ClientSession() as http:
        status, headers, _ = await post(http, router.url + "/v1/chat/completions", "sk-plain")
        assert status == 200 and headers["x-smetric-tenant"] == "default"


async def test_priority_reaches_the_worker_as_sent_within_the_tenants_cap(
    make_worker: MakeWorker, make_router: MakeRouter, key_file: str
) -> None:
    w = await make_worker()
    router = await make_router([w.url], api_key_file=key_file)
    url = router.url + "/v1/chat/completions"
    async with aiohttp.ClientSession() as http:
        assert (await post(http, url, BIG, {**CHAT, "priority": 1000}))[0] == 200
        assert w.bodies[-1]["priority"] == 1000
        assert (await post(http, url, CAPPED, {**CHAT, "priority": 5}))[0] == 200
        assert w.bodies[-1]["priority"] == 5
        status, _, body = await post(http, url, CAPPED, {**CHAT, "priority": 6})
        assert status == 400 and body["error"]["param"] == "priority"
        assert "(5)" in body["error"]["message"]
        for bad in ("high", 1.5, True, 1 << 63):
            status, _, body = await post(http, url, BIG, {**CHAT, "priority": bad})
            assert status == 400 and body["error"]["param"] == "priority", bad
    assert len(w.bodies) == 2


async def test_priority_orders_a_tenants_requests_in_the_router_queue(
    make_worker: MakeWorker, make_router: MakeRouter, key_file: str
) -> None:
    w = await make_worker()
    w.stall = True
    router = await make_router([w.url], api_key_file=key_file, max_concurrent_requests=1)
    gate = router.state.admission
    assert gate is not None
    url = router.url + "/v1/chat/completions"

    def chat(text: str, priority: int) -> dict[str, Any]:
        return {**CHAT, "messages": [{"role": "user", "content": text}], "priority": priority}

    async def queued(n: int) -> None:
        await eventually(lambda: gate.queued == n or None, f"{n} queued")

    async with aiohttp.ClientSession() as http:
        holder = asyncio.create_task(post(http, url, BIG, chat("holder", 0)))
        await eventually(lambda: gate.running == 1 or None, "the slot held")
        waiting = {}
        for n, p in enumerate((0, 7, 3)):
            waiting[p] = asyncio.create_task(post(http, url, BIG, chat(f"queued {p}", p)))
            await queued(n + 1)
        async with http.get(router.url + "/metrics") as r:
            assert value(await r.text(), "smetric_admission_queued", tenant="big") == 3
        w.release.set()
        assert (await holder)[0] == 200
        orders = {}
        for p, task in waiting.items():
            status, headers, _ = await task
            assert status == 200 and headers["x-smetric-tenant"] == "big"
            orders[p] = int(headers["x-smetric-admission-order"])
    assert orders[7] < orders[3] < orders[0], orders
    assert [b["priority"] for b in w.bodies] == [0, 7, 3, 0]


async def test_the_router_wide_token_rate_refuses_any_client_past_it(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    """--rate-limit-tokens-per-second without tenants: prompt tokens over all clients."""
    w = await make_worker()
    router = await make_router([w.url], rate_limit_tokens_per_second=40)
    clock = FakeClock()
    router.state.limits = RateLimiter((), clock, router_tokens_per_second=40)
    long = {**CHAT, "messages": [{"role": "user", "content": "a few words of a prompt " * 4}]}
    chat = router.url + "/v1/chat/completions"
    async with aiohttp.ClientSession() as http:
        async with http.post(chat, json=long) as r:
            assert r.status == 200  # a full bucket lets one prompt over 40 tokens through
        async with http.post(chat, json=CHAT) as r:
            body = await r.json()
            assert r.status == 429, body
            assert int(r.headers["Retry-After"]) >= 1
            assert r.headers["x-smetric-shed"] == "rate_limit"
            assert body["error"]["code"] == "rate_limit_exceeded"
            assert body["error"]["type"] == "tokens"
            assert "40 prompt tokens per second over all clients" in body["error"]["message"]
        clock.advance(int(r.headers["Retry-After"]))
        async with http.post(chat, json=CHAT) as r:
            assert r.status == 200
        async with http.get(router.url + "/metrics") as m:
            text = await m.text()
    assert total(text, "smetric_admission_shed_total", reason="rate_limit") == 1
    assert len(w.bodies) == 2
