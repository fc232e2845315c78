"""Fixtures: fake workers on free ports and a router in-process on a free port."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any, Protocol, TypeVar, overload

import pytest
from aiohttp.test_utils import TestServer

from smetric_router.features.chat_tokenizer import load_chat_tokenizer
from smetric_router.features.extract import FeatureExtractor
from smetric_router.router.app import RUNNER_OPTIONS, RouterState, build_app
from smetric_router.router.config import RouterConfig
from smetric_router.router.routing import HitIndex, TextTree
from tests.router.fakes import FakeWorker

# Background loops are slow unless a test needs them: no test waits on them by accident.
BASE = RouterConfig(health_check_interval_secs=60, load_poll_interval_secs=60, max_retries=2)


class RouterUnderTest:
    def __init__(self, state: RouterState, server: TestServer) -> None:
        self.state = state
        self.server = server
        self.url = f"http://127.0.0.1:{server.port}"


MakeRouter = Callable[..., Awaitable[RouterUnderTest]]
W = TypeVar("W", bound=FakeWorker)


class MakeWorker(Protocol):
    """The `make_worker` fixture: a started worker of class `cls` (a FakeWorker unless given), so
    a test sees the attributes its subclass declares."""

    @overload
    def __call__(self, name: str = ..., *, cls: type[W], **kw: Any) -> Awaitable[W]: ...
    @overload
    def __call__(self, name: str = ..., **kw: Any) -> Awaitable[FakeWorker]: ...


@pytest.fixture(scope="session")
def codec() -> Any:
    return load_chat_tokenizer()


@pytest.fixture
async def make_worker() -> AsyncIterator[MakeWorker]:
    workers: list[FakeWorker] = []

    async def make(name: str = "w", cls: type[FakeWorker] = FakeWorker, **kw: Any) -> Any:
        w = await cls(name, **kw).start()
        workers.append(w)
        return w

    yield make
    for w in workers:
        w.release.set()
        await w.close()


@pytest.fixture
async def make_router(codec: Any) -> AsyncIterator[MakeRouter]:
    servers: list[TestServer] = []

    async def make(
        urls: list[str],
        hits: HitIndex | None = None,
        text_tree: TextTree | None = None,
        l3: Any = None,
        **overrides: Any,
    ) -> RouterUnderTest:
        config = replace(BASE, worker_urls=tuple(urls), **overrides)
        state = RouterState(
            config,
            features_for=lambda page_size: FeatureExtractor(codec, page_size=page_size),
            hits=hits,
            text_tree=text_tree,
            kv_feeds=None,
            l3=l3,
        )
        server = TestServer(build_app(state), host="127.0.0.1", **RUNNER_OPTIONS)
        await server.start_server()
        servers.append(server)
        return RouterUnderTest(state, server)

    yield make
    for s in servers:
        await s.close()
