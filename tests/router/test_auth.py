"""Authentication, JSON-only bodies and what credentials reach the workers (router/auth.py)."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict

from smetric_router.router.cli import build_parser, config_from_args
from smetric_router.router.config import RouterConfig
from tests.helpers.polling import eventually
from tests.router.conftest import MakeRouter, MakeWorker
from tests.router.fakes import FakeWorker
from tests.router.pd_fakes import FakeDecode, FakePrefill, Hub

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
KEY, ADMIN, WORKER_KEY = "inference-key", "admin-key", "worker-key"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class KeyedWorker(FakeWorker):
    """Records the Authorization header of every request the router makes to it."""

    def __init__(self, name: str, **kw: Any) -> None:
        super().__init__(name, **kw)
        self.auth: dict[str, list[str | None]] = {}

    def _saw(self, request: web.Request) -> None:
        got = request.headers.getall("Authorization", [])
        self.auth.setdefault(request.path, []).append(", ".join(got) if got else None)

    async def _health(self, request: web.Request) -> web.Response:
        self._saw(request)
        return await super()._health(request)

    async def _server_info(self, request: web.Request) -> web.Response:
        self._saw(request)
        return await super()._server_info(request)

    async def _loads(self, request: web.Request) -> web.Response:
        self._saw(request)
        return await super()._loads(request)

    async def _flush(self, request: web.Request) -> web.Response:
        self._saw(request)
        return await super()._flush(request)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        self._saw(request)
        return await super()._generate(request)


def assert_openai_error(body: Any, status: int, got: int) -> dict[str, Any]:
    assert got == status, body
    err: dict[str, Any] = body["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


# Inference endpoints ---------------------------------------------------------------------------


async def test_inference_endpoints_need_the_api_key(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    w = await make_worker("a")
    router = await make_router([w.url], api_key=KEY)
    async with aiohttp.ClientSession() as s:
        for headers in ({}, bearer("wrong"), {"Authorization": KEY}, {"Authorization": "Basic x"}):
            for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
                                 ("GET", "/workers"), ("POST", "/generate")):  # fmt: skip
                async with s.request(method, router.url + path, json=CHAT, headers=headers) as r:
                    err = assert_openai_error(await r.json(), 401, r.status)
                    assert err["code"] == "invalid_api_key"
                    assert r.headers["WWW-Authenticate"] == "Bearer"
        assert w.bodies == []  # nothing unauthenticated reached the worker
        async with s.post(router.url + "/v1/chat/completions", json=CHAT, headers=bearer(KEY)) as r:
            assert r.status == 200
        async with s.get(router.url + "/v1/models", headers=bearer(KEY)) as r:
            assert r.status == 200
        # probes and Prometheus carry no key
        for path in ("/health", "/liveness", "/readiness", "/metrics"):
            async with s.get(router.url + path) as r:
                assert r.status == 200, path


async def test_admin_endpoints_need_the_admin_key(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    a, b = await make_worker("a"), await make_worker("b")
    router = await make_router([a.url], api_key=KEY, admin_api_key=ADMIN)
    async with aiohttp.ClientSession() as s:
        calls = [
            ("POST", "/workers", {"url": b.url}),
            ("DELETE", "/workers", {"url": a.url}),
            ("POST", "/flush_cache", None),
        ]
        for method, path, body in calls:
            async with s.request(method, router.url + path, json=body) as r:
                assert (
                    assert_openai_error(await r.json(), 401, r.status)["code"] == "invalid_api_key"
                )
            for key in ("wrong", KEY):  # the inference key is not enough
                async with s.request(
                    method, router.url + path, json=body, headers=bearer(key)
                ) as r:
                    err = assert_openai_error(await r.json(), 403, r.status)
                    assert err["type"] == "permission_error"
        assert list(router.state.registry.workers) == [a.url] and a.flushes == 0
        for method, path, body in calls:
            async with s.request(method, router.url + path, json=body, headers=bearer(ADMIN)) as r:
                assert r.status == 200, await r.text()
        assert list(router.state.registry.workers) == [b.url] and b.flushes == 1
        # reading the worker list is an inference call
        async with s.get(router.url + "/workers", headers=bearer(KEY)) as r:
            assert r.status == 200


async def test_without_admin_key_admin_takes_the_api_key(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    a = await make_worker("a")
    router = await make_router([a.url], api_key=KEY)
    async with aiohttp.ClientSession() as s:
        async with s.post(router.url + "/flush_cache") as r:
            assert r.status == 401
        async with s.post(router.url + "/flush_cache", headers=bearer("wrong")) as r:
            assert r.status == 403
        async with s.post(router.url + "/flush_cache", headers=bearer(KEY)) as r:
            assert r.status == 200
    assert a.flushes == 1


async def test_admin_refuses_cross_origin_browser_requests(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    """A page on another site can POST without a preflight when there is no body (a form, or
    fetch in no-cors mode); the browser marks it with Origin."""
    a = await make_worker("a")
    router = await make_router([a.url])
    async with aiohttp.ClientSession() as s:
        evil = {"Origin": "http://evil.example", "Content-Type": "text/plain"}
        async with s.post(router.url + "/flush_cache", headers=evil) as r:
            assert assert_openai_error(await r.json(), 403, r.status)["code"] == "forbidden"
        async with s.delete(router.url + "/workers", params={"url": a.url}, headers=evil) as r:
            assert r.status == 403
        assert a.flushes == 0 and list(router.state.registry.workers) == [a.url]
        same = {"Origin": router.url}
        async with s.post(router.url + "/flush_cache", headers=same) as r:
            assert r.status == 200
        async with s.post(router.url + "/flush_cache") as r:  # curl, scripts: no Origin
            assert r.status == 200
    assert a.flushes == 2


# Bodies and methods ----------------------------------------------------------------------------


async def test_bodies_must_be_json(make_worker: MakeWorker, make_router: MakeRouter) -> None:
    w = await make_worker("a")
    router = await make_router([w.url])
    raw = json.dumps(CHAT)
    async with aiohttp.ClientSession() as s:
        for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                      "application/octet-stream", None):  # fmt: skip
            headers: dict[str, str] = {} if ctype is None else {"Content-Type": ctype}
            for path in ("/v1/chat/completions", "/generate", "/workers"):
                async with s.post(router.url + path, data=raw.encode(), headers=headers) as r:
                    err = assert_openai_error(await r.json(), 415, r.status)
                    assert err["code"] == "unsupported_media_type"
                    assert "application/json" in err["message"]
        assert w.bodies == [] and len(router.state.registry.workers) == 1
        for ctype in ("application/json", "application/json; charset=utf-8", "Application/JSON"):
            headers = {"Content-Type": ctype}
            async with s.post(router.url + "/v1/chat/completions", data=raw, headers=headers) as r:
                assert r.status == 200, ctype
        # a POST without a body needs no type (bench_serving's and curl's POST /flush_cache)
        async with s.post(router.url + "/flush_cache", skip_auto_headers=["Content-Type"]) as r:
            assert r.status == 200
    assert len(w.bodies) == 3


async def test_flush_cache_is_post_only(make_worker: MakeWorker, make_router: MakeRouter) -> None:
    w = await make_worker("a")
    router = await make_router([w.url])
    async with aiohttp.ClientSession() as s:
        for method in ("GET", "PUT", "DELETE"):
            async with s.request(method, router.url + "/flush_cache") as r:
                assert r.status == 405, method
    assert w.flushes == 0


# What the workers get --------------------------------------------------------------------------


async def test_client_authorization_is_not_forwarded(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    w = await make_worker("a", cls=KeyedWorker)
    # the router's own key, or a key meant for nobody (the openai client always sends one)
    for overrides in ({}, {"api_key": KEY}):
        router = await make_router([w.url], **overrides)
        async with aiohttp.ClientSession() as s:
            for path in ("/v1/chat/completions", "/generate"):
                body = CHAT if path != "/generate" else {"text": "hi"}
                async with s.post(router.url + path, json=body, headers=bearer(KEY)) as r:
                    assert r.status == 200
                assert w.auth[path][-1] is None, overrides
    assert len(w.auth["/v1/chat/completions"]) == len(w.auth["/generate"]) == 2


async def test_forward_authorization_passes_the_clients_header(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    w = await make_worker("a", cls=KeyedWorker)
    router = await make_router([w.url], forward_authorization=True)
    two = CIMultiDict([("Authorization", "Bearer own"), ("Authorization", "Bearer second")])
    async with aiohttp.ClientSession() as s:
        for headers in (bearer("own"), two):
            async with s.post(router.url + "/v1/chat/completions", json=CHAT, headers=headers) as r:
                assert r.status == 200
    assert w.auth["/v1/chat/completions"] == ["Bearer own", "Bearer own"]


async def test_worker_key_on_generation_and_on_the_routers_own_calls(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    w = await make_worker("a", cls=KeyedWorker)
    router = await make_router(
        [w.url],
        api_key=KEY,
        worker_api_key=WORKER_KEY,
        health_check_interval_secs=0.05,
        load_poll_interval_secs=0.05,
    )
    await eventually(
        lambda: "/health" in w.auth and "/v1/loads" in w.auth,
        "the health and load probes sent with the key",
    )
    async with aiohttp.ClientSession() as s:
        async with s.post(router.url + "/v1/chat/completions", json=CHAT, headers=bearer(KEY)) as r:
            assert r.status == 200
        async with s.post(router.url + "/flush_cache", headers=bearer(KEY)) as r:
            assert r.status == 200
    expected = f"Bearer {WORKER_KEY}"
    for path in ("/server_info", "/health", "/v1/loads", "/v1/chat/completions", "/flush_cache"):
        assert w.auth[path] and set(w.auth[path]) == {expected}, path


class KeyedPrefill(FakePrefill):
    async def _generate(self, request: web.Request) -> web.StreamResponse:
        self.headers.append(dict(request.headers))
        return await super()._generate(request)


async def test_pd_sends_the_worker_key_not_the_clients(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    hub = Hub()
    p = await make_worker("p", cls=KeyedPrefill, hub=hub)
    d = await make_worker("d", cls=FakeDecode, hub=hub)
    router = await make_router(
        [], pd_disaggregation=True, prefill=((p.url, p.bootstrap_port),), decode_urls=(d.url,),
        worker_api_key=WORKER_KEY,
    )  # fmt: skip
    async with (
        aiohttp.ClientSession() as s,
        s.post(router.url + "/generate", json={"text": "hi"}, headers=bearer("own")) as r,
    ):
        assert r.status == 200, await r.text()
    for w in (p, d):
        assert [h.get("Authorization") for h in w.headers] == [f"Bearer {WORKER_KEY}"]


class LockedWorker(FakeWorker):
    """Like SGLang with --api-key: /server_info and the rest need the key (not /health)."""

    async def _server_info(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {WORKER_KEY}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await super()._server_info(request)


async def test_a_worker_refusing_the_router_is_excluded_with_the_reason(
    make_worker: MakeWorker, make_router: MakeRouter, caplog: pytest.LogCaptureFixture
) -> None:
    w = await make_worker("a", cls=LockedWorker)
    router = await make_router([w.url])  # no --worker-api-key
    registry = router.state.registry
    assert not registry.workers[w.url].healthy
    assert "--worker-api-key" in (registry.workers[w.url].problem or "")
    assert "--worker-api-key" in caplog.text
    async with aiohttp.ClientSession() as s:
        async with s.post(router.url + "/v1/chat/completions", json=CHAT) as r:
            assert r.status == 503
        async with s.delete(router.url + "/workers", params={"url": w.url}) as r:
            assert r.status == 200
        async with s.post(router.url + "/workers", json={"url": w.url}) as r:
            err = assert_openai_error(await r.json(), 400, r.status)
            assert "HTTP 401" in err["message"] and "--worker-api-key" in err["message"]
    keyed = await make_router([w.url], worker_api_key=WORKER_KEY)
    assert keyed.state.registry.workers[w.url].healthy


# Configuration ---------------------------------------------------------------------------------


def test_keys_come_from_flags_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMETRIC_API_KEY", "env-key")
    monkeypatch.setenv("SMETRIC_ADMIN_API_KEY", "env-admin")
    monkeypatch.setenv("SMETRIC_WORKER_API_KEY", "env-worker")
    c = config_from_args([])
    assert (c.api_key, c.admin_api_key, c.worker_api_key) == ("env-key", "env-admin", "env-worker")
    c = config_from_args(["--api-key", "flag-key", "--worker-api-key", "flag-worker"])
    assert (c.api_key, c.admin_api_key, c.worker_api_key) == (
        "flag-key",
        "env-admin",
        "flag-worker",
    )
    # keys never show in --help or in the config's repr
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    help_text = " ".join(out.getvalue().split())
    assert "env-key" not in help_text and "SMETRIC_API_KEY" in help_text
    assert "SMETRIC_ADMIN_API_KEY" in help_text and "SMETRIC_WORKER_API_KEY" in help_text
    assert "flag-key" not in repr(c) and "env-admin" not in repr(c)
    monkeypatch.delenv("SMETRIC_API_KEY")
    monkeypatch.setenv("SMETRIC_ADMIN_API_KEY", "")
    c = config_from_args([])
    assert c.api_key is None and c.admin_api_key is None  # empty = unset


@pytest.mark.parametrize(
    "kw",
    [
        {"api_key": ""},
        {"admin_api_key": "two words"},
        {"worker_api_key": "line\r\nX-Injected: 1"},
        {"api_key": "clé"},
        {"worker_api_key": "k", "forward_authorization": True},
    ],
)
def test_bad_key_settings_fail_at_start(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RouterConfig(**kw)


def test_forward_and_worker_key_exclude_each_other_on_the_cli() -> None:
    err = io.StringIO()
    with redirect_stderr(err), pytest.raises(SystemExit):
        config_from_args(["--worker-api-key", "k", "--forward-authorization"])
    assert "exclude each other" in err.getvalue()
