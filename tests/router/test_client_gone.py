"""A write to a client that has just left is not the router's error: the request ends quietly
and the router serves on. The same exception with the client still there is an internal error,
answered 500 and logged."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from smetric_router.router.proxy import Proxy
from tests.router.conftest import MakeRouter, MakeWorker, RouterUnderTest

BODY = {"text": "hello", "stream": True}


Dispatch = Callable[..., Awaitable[web.StreamResponse]]


async def router_whose_dispatch(
    make_worker: MakeWorker,
    make_router: MakeRouter,
    monkeypatch: pytest.MonkeyPatch,
    fake: Dispatch,
) -> RouterUnderTest:
    """A router over one fake worker, its proxy's dispatch replaced by `fake`."""
    w = await make_worker("a")
    router = await make_router([w.url])
    monkeypatch.setattr(Proxy, "dispatch", fake)
    return router


async def test_a_client_gone_mid_answer_ends_quietly(
    make_worker: MakeWorker,
    make_router: MakeRouter,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    real = Proxy.dispatch

    async def leaves(
        self: Proxy, request: web.Request, *args: Any, **kw: Any
    ) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.close()  # the client left; its cancellation has not arrived yet
        raise aiohttp.ClientConnectionResetError("Cannot write to closing transport")

    router = await router_whose_dispatch(make_worker, make_router, monkeypatch, leaves)
    caplog.set_level(logging.DEBUG, logger="smetric_router.router.app")
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.ClientError):
            async with s.post(router.url + "/generate", json=BODY) as resp:
                await resp.read()
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert any("client left" in r.getMessage() for r in caplog.records)
        monkeypatch.setattr(Proxy, "dispatch", real)
        async with s.post(router.url + "/generate", json=BODY) as resp:
            assert resp.status == 200
            assert (await resp.read()).endswith(b"data: [DONE]\n\n")


async def test_a_reset_with_the_client_still_there_is_an_internal_error(
    make_worker: MakeWorker,
    make_router: MakeRouter,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def resets(
        self: Proxy, request: web.Request, *args: Any, **kw: Any
    ) -> web.StreamResponse:
        raise ConnectionResetError("not the client's doing")

    router = await router_whose_dispatch(make_worker, make_router, monkeypatch, resets)
    async with aiohttp.ClientSession() as s, s.post(router.url + "/generate", json=BODY) as resp:
        assert resp.status == 500
        assert (await resp.json())["error"]["code"] == "internal_error"
    assert any("internal error" in r.getMessage() for r in caplog.records)
