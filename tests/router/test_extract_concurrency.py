"""A chat small enough to read on the event loop is never queued behind a long one being
tokenized in the features thread: the extractor is thread-safe, so both are read at once."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from smetric_router.core.types import RequestFeatures
from smetric_router.features.budget import UNLIMITED, Budget
from smetric_router.features.extract import FeatureExtractor
from smetric_router.router.app import RUNNER_OPTIONS, RouterState, build_app
from smetric_router.router.routing import INLINE_CHARS
from tests.router.conftest import BASE, MakeWorker


class GatedExtractor(FeatureExtractor):
    """Holds every chat it reads off the loop (its budget has no inline limit) until `gate`."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.gate = threading.Event()
        self.holding = threading.Event()

    def from_chat(self, body: Mapping[str, Any], budget: Budget = UNLIMITED) -> RequestFeatures:
        if budget.inline_chars is None:
            self.holding.set()
            self.gate.wait(60)
        return super().from_chat(body, budget)


async def test_a_short_chat_is_routed_while_a_long_one_is_tokenized_off_the_loop(
    make_worker: MakeWorker, codec: Any
) -> None:
    worker = await make_worker("a")
    extractor = GatedExtractor(codec, page_size=16)
    state = RouterState(
        replace(BASE, worker_urls=(worker.url,)),
        features_for=lambda page_size: extractor,
        hits=None,
        text_tree=None,
        kv_feeds=None,
    )
    server = TestServer(build_app(state), host="127.0.0.1", **RUNNER_OPTIONS)
    await server.start_server()
    url = f"http://127.0.0.1:{server.port}/v1/chat/completions"

    async def chat(http: aiohttp.ClientSession, text: str) -> tuple[int, str]:
        body = {"model": "fake-model", "messages": [{"role": "user", "content": text}]}
        async with http.post(url, json=body) as r:
            await r.read()
            return r.status, r.headers.get("x-smetric-reason", "")

    try:
        async with aiohttp.ClientSession() as http:
            long = asyncio.create_task(chat(http, "word " * (INLINE_CHARS // 2)))
            assert await asyncio.to_thread(extractor.holding.wait, 30), "never offloaded"
            # bounded: before, it waited for the long one's lane until the gate opened
            short = await asyncio.wait_for(chat(http, "List the files."), 20)
            assert short == (200, "first-turn-balance")
            assert not long.done()
            extractor.gate.set()
            assert (await long) == (200, "first-turn-balance")
    finally:
        extractor.gate.set()
        await server.close()
