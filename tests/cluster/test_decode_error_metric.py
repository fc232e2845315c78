"""The router's /metrics counts undecodable KV-event batches (a foreign schema, garbage)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import aiohttp
import msgspec
from aiohttp import web
from aiohttp.test_utils import TestServer

from smetric_router.cluster.kv_index import KvIndex
from smetric_router.cluster.subscriber import FeedConfig, KvEventHub
from smetric_router.features.chat_tokenizer import load_chat_tokenizer
from smetric_router.features.extract import FeatureExtractor
from smetric_router.router.app import RUNNER_OPTIONS, RouterState, build_app
from smetric_router.router.config import RouterConfig
from tests.cluster.recorded_worker import RecordedWorker
from tests.fixtures.kv_events import load
from tests.helpers.prometheus import value
from tests.router.fakes import FakeWorker

REC = load()
BASE = RouterConfig(health_check_interval_secs=60, load_poll_interval_secs=60)


class EventsWorker(FakeWorker):
    """A fake worker whose /server_info points at the recorded SGLang sockets."""

    def __init__(self, events: RecordedWorker) -> None:
        super().__init__("w", page_size=REC.page_size)
        self.events = events

    async def _server_info(self, request: web.Request) -> web.Response:
        info = {"page_size": self.page_size, "kv_events": self.events.descriptor()}
        return web.json_response(info)


async def metric(url: str, name: str, worker: str) -> float | None:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as resp:
        text = await resp.text()
    return value(text, name, worker=worker)


async def test_decode_errors_reach_the_routers_metrics() -> None:
    events = await RecordedWorker(REC).start()
    worker = await EventsWorker(events).start()
    hub = KvEventHub(KvIndex(), config=FeedConfig(replay_timeout_s=0.5, retry_max_s=0.2))
    chat = load_chat_tokenizer()
    state = RouterState(
        replace(BASE, worker_urls=(worker.url,)),
        features_for=lambda page: FeatureExtractor(chat, page_size=page),
        hits=hub.index,
        text_tree=None,
        kv_feeds=hub,
    )
    router = TestServer(build_app(state), host="127.0.0.1", **RUNNER_OPTIONS)
    await router.start_server()
    url = f"http://127.0.0.1:{router.port}"
    try:
        events.published_before_anyone_joined(1)
        await events.subscribed()
        deadline = time.monotonic() + 10
        while (s := hub.stats(worker.url)) is None or s.last_seq != 1:
            assert time.monotonic() < deadline, "no warm start"
            await asyncio.sleep(0.01)
        name = "smetric_kv_event_decode_errors_total"
        assert await metric(url, name, worker.url) == 0.0
        events.payloads[2] = msgspec.msgpack.encode([1.0, [{"type": "BlockPinned"}], 0])
        events.payloads[3] = b"\xc1garbage"
        for m in REC.sub[:3]:  # seq 2 (foreign), 3 (garbage), 4 (SGLang's)
            await events.send(m)
        while (s := hub.stats(worker.url)) is None or s.last_seq != 4:
            assert time.monotonic() < deadline, "live batches not applied"
            await asyncio.sleep(0.01)
        assert await metric(url, name, worker.url) == 2.0
        assert await metric(url, "smetric_kv_event_resets_total", worker.url) == 2.0
    finally:
        await router.close()
        await worker.close()
        await events.close()
