"""A recording reverse proxy between a coding agent and the router (tests' instrument).

The agents show neither the router's decision headers nor each reply's cache report, so the tests
put this in front of the router: it passes every request and reply through unchanged and keeps,
per generation request, the endpoint, status, `x-smetric-worker` / `x-smetric-reason` and the
prompt and cached tokens the reply reports (Anthropic usage, Responses usage, chat usage).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from smetric_router.core.port_file import bound_port

_HOP = {"host", "content-length", "transfer-encoding", "connection", "content-encoding"}


@dataclass
class Exchange:
    method: str
    path: str
    status: int
    worker: str | None
    reason: str | None
    prompt_tokens: int | None  # what the reply reports, cached included
    cached_tokens: int | None
    body: bytes  # the reply, for failure messages


def _events(body: bytes) -> Iterator[Any]:
    """The JSON payloads of an SSE body (or the one JSON object of a plain reply)."""
    if not body.lstrip().startswith((b"event:", b"data:")):
        with contextlib.suppress(orjson.JSONDecodeError):
            yield orjson.loads(body)
        return
    for line in body.splitlines():
        if line.startswith(b"data:") and line[5:].strip() not in (b"", b"[DONE]"):
            with contextlib.suppress(orjson.JSONDecodeError):
                yield orjson.loads(line[5:])


def _usage(obj: Any) -> tuple[int, int] | None:
    """(prompt, cached) from one reply object or event of any of the three APIs."""
    if not isinstance(obj, dict):
        return None
    for inner in ("message", "response"):  # Anthropic message_start, Responses events
        if isinstance(obj.get(inner), dict) and "usage" in obj[inner]:
            obj = obj[inner]
    u = obj.get("usage")
    if not isinstance(u, dict):
        return None
    if "cache_read_input_tokens" in u or ("input_tokens" in u and "output_tokens" in u):
        if "input_tokens_details" in u:  # Responses
            cached = (u.get("input_tokens_details") or {}).get("cached_tokens") or 0
            return int(u["input_tokens"]), int(cached)
        cached = u.get("cache_read_input_tokens") or 0  # Anthropic: input excludes cached
        return int(u.get("input_tokens") or 0) + int(cached), int(cached)
    if "prompt_tokens" in u:
        cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return int(u["prompt_tokens"]), int(cached)
    return None


def usage_of(body: bytes) -> tuple[int, int] | None:
    found = None
    for obj in _events(body):
        found = _usage(obj) or found
    return found


class Recorder:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.exchanges: list[Exchange] = []
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.url = ""

    async def start(self) -> str:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._session = aiohttp.ClientSession(auto_decompress=False)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = bound_port(self._runner)
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def generation(self, path_prefix: str) -> list[Exchange]:
        return [e for e in self.exchanges if e.path.startswith(path_prefix)]

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        data = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self._session.request(
            request.method, self.upstream + request.path_qs, data=data, headers=headers
        ) as up:
            resp = web.StreamResponse(
                status=up.status,
                headers={k: v for k, v in up.headers.items() if k.lower() not in _HOP},
            )
            if "content-encoding" in up.headers:
                resp.headers["content-encoding"] = up.headers["content-encoding"]
            await resp.prepare(request)
            body = bytearray()
            client_left = False
            async for chunk in up.content.iter_any():
                body += chunk
                client_left = client_left or not await _relay(resp, chunk)
            if not client_left:
                await _relay(resp, None)
        usage = usage_of(bytes(body)) if request.method == "POST" else None
        self.exchanges.append(
            Exchange(
                request.method,
                request.path,
                up.status,
                up.headers.get("x-smetric-worker"),
                up.headers.get("x-smetric-reason"),
                usage[0] if usage else None,
                usage[1] if usage else None,
                bytes(body[:2000]),
            )
        )
        return resp


async def _relay(resp: web.StreamResponse, chunk: bytes | None) -> bool:
    """Pass a chunk (None: the end) to the agent; False when it has gone. An agent may close as
    soon as it has read its answer's last event, before the chunked stream's terminator: the
    exchange is still recorded whole."""
    try:
        await (resp.write(chunk) if chunk is not None else resp.write_eof())
    except ConnectionResetError:
        return False
    return True


@contextlib.asynccontextmanager
async def recording(upstream: str) -> AsyncIterator[Recorder]:
    """A Recorder in front of `upstream` for the length of the block."""
    r = Recorder(upstream)
    await r.start()
    try:
        yield r
    finally:
        await r.stop()
