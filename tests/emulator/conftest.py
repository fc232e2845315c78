"""An emulated worker served in-process on free ports, with a client session."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from smetric_router.emulator.config import EmulatorConfig
from smetric_router.emulator.server import make_app, start_server
from smetric_router.emulator.tokenizer import DEFAULT_TOKENIZER_DIR, load_tokenizer
from smetric_router.engine.api import EngineConfig
from smetric_router.engine.engine import Engine
from tests.emulator.reference import ReferenceTokenizer

MODEL = "emu-test"
PAGE = 16


def free_ports(n: int) -> list[int]:
    """n distinct free ports (held together while chosen, so none is handed out twice)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Worker:
    url: str
    http: aiohttp.ClientSession
    config: EmulatorConfig
    codec: ReferenceTokenizer  # tokenization checked against transformers, not the emulator

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        async with self.http.post(self.url + path, json=body) as r:
            raw = await r.read()
            ctype = r.headers.get("Content-Type", "")
            return r.status, orjson.loads(raw) if "json" in ctype else raw.decode()

    async def get(self, path: str) -> tuple[int, Any]:
        async with self.http.get(self.url + path) as r:
            raw = await r.read()
            ctype = r.headers.get("Content-Type", "")
            return r.status, orjson.loads(raw) if "json" in ctype else raw.decode()

    async def sse(self, path: str, body: dict[str, Any]) -> list[Any]:
        """Every `data:` event of a streamed response, [DONE] included as the string."""
        events: list[Any] = []
        async with self.http.post(self.url + path, json=body) as r:
            assert r.status == 200, await r.text()
            assert r.headers["Content-Type"].startswith("text/event-stream")
            async for line in r.content:
                if line.startswith(b"data: "):
                    data = line[6:].strip()
                    events.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
        return events


def make_config(**changes: Any) -> EmulatorConfig:
    """A worker's config on fresh free ports (HTTP, KV events, replay, bootstrap)."""
    http_port, events_port, replay_port, bootstrap_port = free_ports(4)
    config = EmulatorConfig(
        host="127.0.0.1",
        port=http_port,
        model_name=MODEL,
        tokenizer_path=str(DEFAULT_TOKENIZER_DIR),
        kv_events_port=events_port,
        kv_events_replay_port=replay_port,
        bootstrap_port=bootstrap_port,
        speedup=50.0,
        engine=EngineConfig(page_size=PAGE, gpu_kv_tokens=1 << 16),
    )
    return replace(config, **changes)


@contextlib.asynccontextmanager
async def serving(config: EmulatorConfig) -> AsyncIterator[Worker]:
    tokenizer = load_tokenizer(config.tokenizer_path, config.chat_template)
    app = make_app(config, Engine(config.engine), tokenizer)
    runner = await start_server(app, config.host, config.port)
    try:
        async with aiohttp.ClientSession() as http:
            reference = ReferenceTokenizer(Path(config.tokenizer_path))
            yield Worker(f"http://{config.host}:{config.port}", http, config, reference)
    finally:
        await runner.cleanup()


@pytest.fixture
async def worker() -> AsyncIterator[Worker]:
    async with serving(make_config()) as w:
        yield w
