"""The router process names no version in any answer, aiohttp's own 400s included."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from tests.helpers.router_process import router_process
from tests.router.fakes import FakeWorker

UNPARSEABLE = (
    b"GARBAGE\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1_0\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
)


async def raw_head(port: int, request: bytes) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        return head.decode("latin-1")
    finally:
        writer.close()


async def test_no_version_in_any_answer(tmp_path: Path) -> None:
    worker = await FakeWorker("w").start()
    try:
        args = ["--worker-urls", worker.url]
        async with router_process(args, tmp_path / "ports.json") as url:
            port = int(url.rsplit(":", 1)[1])
            for request in UNPARSEABLE:
                head = await raw_head(port, request)
                assert head.startswith("HTTP/1.") and " 400 " in head.split("\r\n")[0], head
                servers = [h for h in head.split("\r\n") if h.lower().startswith("server:")]
                assert servers in ([], ["Server: smetric-router"]), (request, head)
            async with aiohttp.ClientSession() as http, http.get(url + "/health") as r:
                assert r.status == 200  # and it still serves
                assert "Server" not in r.headers
    finally:
        await worker.close()
