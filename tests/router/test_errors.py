"""Requests the router answers itself: OpenAI-style 4xx bodies, and it keeps serving after them."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.helpers.polling import eventually
from tests.router.conftest import MakeRouter, MakeWorker


def assert_openai_error(body: Any, code: str | None = None) -> None:
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"] and err["type"] == "invalid_request_error"
    if code is not None:
        assert err["code"] == code


@pytest.mark.parametrize(
    ("path", "payload", "status", "code"),
    [
        ("/v1/chat/completions", b"{not json", 400, None),
        ("/v1/chat/completions", b"[1, 2]", 400, None),
        ("/v1/chat/completions", b'{"model": "fake-model"}', 400, None),
        ("/v1/chat/completions", b'{"model": "fake-model", "messages": "hi"}', 400, None),
        ("/v1/completions", b'{"model": "fake-model"}', 400, None),
        ("/generate", b'{"sampling_params": {}}', 400, None),
        ("/v1/completions", b'{"model": 3, "prompt": "x"}', 400, None),
    ],
)
async def test_bad_requests_get_openai_errors(
    make_worker: MakeWorker,
    make_router: MakeRouter,
    path: str,
    payload: bytes,
    status: int,
    code: str | None,
) -> None:
    w = await make_worker("a")
    router = await make_router([w.url])
    async with aiohttp.ClientSession() as s:
        headers = {"Content-Type": "application/json"}
        async with s.post(router.url + path, data=payload, headers=headers) as resp:
            assert resp.status == status
            assert_openai_error(await resp.json(), code)
        ok = {"model": "fake-model", "messages": [{"role": "user", "content": "x"}]}
        async with s.post(router.url + "/v1/chat/completions", json=ok) as resp:
            assert resp.status == 200
    assert len(w.bodies) == 1  # nothing malformed reached the worker


async def test_oversized_body_is_413(make_worker: MakeWorker, make_router: MakeRouter) -> None:
    w = await make_worker("a")
    router = await make_router([w.url], max_body_bytes=4096)
    big = {"model": "fake-model", "messages": [{"role": "user", "content": "x" * 10_000}]}
    async with aiohttp.ClientSession() as s:
        async with s.post(router.url + "/v1/chat/completions", json=big) as resp:
            assert resp.status == 413
            assert_openai_error(await resp.json(), "request_too_large")

        async def chunks() -> Any:  # no Content-Length: the limit applies while reading
            for _ in range(10):
                yield b"x" * 1000

        json_type = {"Content-Type": "application/json"}
        async with s.post(router.url + "/generate", data=chunks(), headers=json_type) as resp:
            assert resp.status == 413
            assert_openai_error(await resp.json(), "request_too_large")
    assert w.bodies == []


async def test_no_healthy_worker_is_503(make_worker: MakeWorker, make_router: MakeRouter) -> None:
    w = await make_worker("a")
    w.healthy = False
    router = await make_router([w.url], health_check_interval_secs=0.05)
    registry = router.state.registry
    await eventually(lambda: not registry.healthy(), "the first health check excluding it")
    async with aiohttp.ClientSession() as s:
        body = {"text": "hello"}
        async with s.post(router.url + "/generate", json=body) as resp:
            assert resp.status == 503
            assert (await resp.json())["error"]["code"] == "no_worker_available"
