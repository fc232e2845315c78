"""An emulated worker served in-process on ports it binds itself (0), with a client session."""

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

from smetric_router.emulator.__main__ import start_bound
from smetric_router.emulator.config import EmulatorConfig
from smetric_router.emulator.server import EMULATOR, make_app
from smetric_router.emulator.tokenizer import DEFAULT_TOKENIZER_DIR, load_tokenizer
from smetric_router.engine.api import EngineConfig
from smetric_router.engine.engine import Engine
from tests.emulator.reference import ReferenceTokenizer

MODEL = "emu-test"
PAGE = 16


def free_ports(n: int) -> list[int]:
    """n distinct ports free now and then released: for a port nobody should listen on, or one a
    test's own socket binds (servers under test bind port 0 instead)."""
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
    """A worker's config on ports 0 (HTTP, KV events, replay, bootstrap): serving() binds free
    ones and its Worker's config holds them as bound."""
    config = EmulatorConfig(
        host="127.0.0.1",
        port=0,
        model_name=MODEL,
        tokenizer_path=str(DEFAULT_TOKENIZER_DIR),
        kv_events_port=0,
        kv_events_replay_port=0,
        bootstrap_port=0,
        speedup=50.0,
        engine=EngineConfig(page_size=PAGE, gpu_kv_tokens=1 << 16),
    )
    return replace(config, **changes)


@contextlib.asynccontextmanager
async def serving(config: EmulatorConfig) -> AsyncIterator[Worker]:
    tokenizer = load_tokenizer(config.tokenizer_path, config.chat_template)
    app = make_app(config, Engine(config.engine), tokenizer)
    runner, ports = await start_bound(app)
    config = app[EMULATOR].config  # the ports as bound
    try:
        async with aiohttp.ClientSession() as http:
            reference = ReferenceTokenizer(Path(config.tokenizer_path))
            yield Worker(f"http://{config.host}:{ports['http']}", http, config, reference)
    finally:
        await runner.cleanup()


@pytest.fixture
async def worker() -> AsyncIterator[Worker]:
    async with serving(make_config()) as w:
        yield w
