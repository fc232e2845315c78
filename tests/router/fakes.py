"""A small in-test SGLang-like worker with scriptable faults (the router tests' only upstream)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class FakeWorker:
    GENERATION_PATHS: tuple[str, ...] = ("/v1/chat/completions", "/v1/completions", "/generate")

    def __init__(
        self, name: str, *, page_size: int = 16, model: str = "fake-model", port: int | None = None
    ) -> None:
        self.name = name
        self.port = port  # None: any free port
        self.page_size = page_size
        self.model = model
        self.bodies: list[dict[str, Any]] = []  # generation requests received, in order
        self.headers: list[dict[str, str]] = []
        self.fail_next = 0  # answer the next n generation requests with 503, before any byte
        self.fail_status = 503  # ...or with this status
        self.die_mid_stream_next = 0  # cut the connection after the first stream chunk
        self.cut_event = False  # when cutting, send only half of the second event first
        self.die_after_done_next = 0  # send the whole stream, then cut before its chunked end
        self.stall = False  # accept generation requests and answer only after `release`
        self.hold_stream = False  # after the first chunk, wait for `release` before finishing
        self.release = asyncio.Event()
        self.healthy = True
        self.running_reqs = 0
        self.waiting_reqs = 0
        self.waiting_uncached_tokens: int | None = None  # /v1/loads leaves it out while None
        self.flushes = 0
        self.server: TestServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.port}"

    async def start(self) -> FakeWorker:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/server_info", self._server_info)
        app.router.add_get("/model_info", self._model_info)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/loads", self._loads)
        app.router.add_post("/flush_cache", self._flush)
        for path in self.GENERATION_PATHS:
            app.router.add_post(path, self._generate)
        self.server = TestServer(app, host="127.0.0.1", port=self.port)
        await self.server.start_server()
        return self

    async def close(self) -> None:
        if self.server is not None:
            await self.server.close()

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def _server_info(self, request: web.Request) -> web.Response:
        return web.json_response({"page_size": self.page_size, "kv_events": None})

    async def _model_info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": self.model, "is_generation": True})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model}]})

    async def _loads(self, request: web.Request) -> web.Response:
        entry = {"dp_rank": 0, "num_running_reqs": self.running_reqs}
        entry["num_waiting_reqs"] = self.waiting_reqs
        if self.waiting_uncached_tokens is not None:
            entry["num_waiting_uncached_tokens"] = self.waiting_uncached_tokens
        return web.json_response({"loads": [entry]})

    async def _flush(self, request: web.Request) -> web.Response:
        self.flushes += 1
        return web.Response(text="Cache flushed.")

    def reply(self, path: str) -> dict[str, Any]:
        text = f"hello from {self.name}"
        if path == "/v1/chat/completions":
            return {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": self.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
            }
        if path == "/v1/completions":
            return {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": 0,
                "model": self.model,
                "choices": [{"index": 0, "text": text, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
            }
        return {"text": text, "meta_info": {"id": "r1", "finish_reason": {"type": "stop"}}}

    def chunks(self, path: str) -> list[bytes]:
        if path == "/v1/chat/completions":
            return [
                sse(
                    {
                        "id": "chatcmpl-1",
                        "object": "chat.completion.chunk",
                        "created": 0,
                        "model": self.model,
                        "choices": [
                            {"index": 0, "delta": {"content": word}, "finish_reason": None}
                        ],
                    }
                )
                for word in ("hello", " from", f" {self.name}")
            ] + [b"data: [DONE]\n\n"]
        return [sse({"text": t}) for t in ("a", "ab", "abc")] + [b"data: [DONE]\n\n"]

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        if self.stall:
            await self.release.wait()
        if self.fail_next > 0:
            self.fail_next -= 1
            return web.json_response({"error": "injected"}, status=self.fail_status)
        if body.get("model") not in (None, self.model):
            return web.json_response({"error": {"message": "bad model"}}, status=400)
        if not body.get("stream"):
            return web.json_response(self.reply(request.path), headers={"x-fake": self.name})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunks = self.chunks(request.path)
        await resp.write(chunks[0])
        if self.die_mid_stream_next > 0:
            self.die_mid_stream_next -= 1
            if self.cut_event:
                await resp.write(chunks[1][:9])
            assert request.transport is not None
            request.transport.abort()
            return resp
        if self.hold_stream:
            await self.release.wait()
        for c in chunks[1:]:
            await resp.write(c)
        if self.die_after_done_next > 0:  # killed after its last event, before closing
            self.die_after_done_next -= 1
            assert request.transport is not None
            request.transport.abort()
            return resp
        await resp.write_eof()
        return resp


class DroppingWorker(FakeWorker):
    """Reads a generation request, then drops the connection without a byte (a worker killed by
    the request it was running), while `budget` lasts: a one-item list the workers of a test
    share, so that whichever gets the first request drops it. Mixed in before FakeDecode, a
    dropping decode."""

    def __init__(self, name: str, *, budget: list[int], **kw: Any) -> None:
        super().__init__(name, **kw)
        self.budget = budget

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        if self.budget[0] > 0:
            self.budget[0] -= 1
            self.bodies.append(await request.json())
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        return await super()._generate(request)
