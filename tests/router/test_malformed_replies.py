"""Workers whose replies break HTTP/1.1 framing, through the router's HTTP app: a 502 in OpenAI's
shape (or, once a stream is under way, its clean end), never a truncated 200; the connection is
closed, not pooled, and the next request is served. (Under PD: test_pd_upstream.py.)"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from tests.helpers.polling import eventually
from tests.router.conftest import MakeRouter, MakeWorker
from tests.router.fakes import FakeWorker
from tests.router.test_pd import CHAT

JSON = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
SSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
CHUNKED = b"Transfer-Encoding: chunked\r\n"
PARTIAL = b'{"id": "x"'  # what a client got as a whole answer when `1_0` was read as 10
BODY = PARTIAL + b', "object": "chat.completion"}'

# Bad framing in the head: the router never sends a byte of it on (and may try another worker).
BAD_HEADS = {
    "length with an underscore": JSON + b"Content-Length: 1_0\r\n\r\n" + BODY,
    "negative length": JSON + b"Content-Length: -1\r\n\r\n" + BODY,
    "signed length": JSON + b"Content-Length: +10\r\n\r\n" + BODY,
    "two lengths": JSON + b"Content-Length: 10\r\nContent-Length: 42\r\n\r\n" + BODY,
    "chunked and a length": JSON + CHUNKED + b"Content-Length: 10\r\n\r\n2a\r\n" + BODY,
    "junk status line": b"HTTP/1.1 2x0 OK\r\nContent-Length: 42\r\n\r\n" + BODY,
}
# Bad framing after a good head: the body is not whole, so none of it is sent on.
BAD_BODIES = {
    "bad chunk size": JSON + CHUNKED + b"\r\nzz\r\n" + BODY,
    "shorter than its length, then the end": JSON + b"Content-Length: 42\r\n\r\n" + PARTIAL,
}


class RawWorker(FakeWorker):
    """Answers generation requests with `raw`, byte for byte, while it is set; then keeps the
    connection open until the router closes it (`close`: closes it at once, after the bytes)."""

    def __init__(self, name: str, **kw: Any) -> None:
        super().__init__(name, **kw)
        self.raw: bytes | None = None
        self.close_after = False
        self.closed_by_router = 0  # connections the router closed after a raw reply

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        if self.raw is None:
            return await super()._generate(request)
        self.bodies.append(await request.json())
        transport = request.transport
        assert transport is not None
        transport.write(self.raw)
        if self.close_after:
            transport.close()
            return web.Response()
        try:  # aiohttp cancels this handler when the router closes the connection
            deadline = time.monotonic() + 5
            while not transport.is_closing() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        finally:
            self.closed_by_router += transport.is_closing()
        return web.Response()


async def _ask(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/chat/completions", json=body) as r:
        return r.status, await r.read()


def _error(raw: bytes) -> dict[str, Any]:
    err: dict[str, Any] = orjson.loads(raw)["error"]
    return err


@pytest.mark.parametrize("reply", [*BAD_HEADS.values(), *BAD_BODIES.values()],
                         ids=[*BAD_HEADS, *BAD_BODIES])  # fmt: skip
async def test_malformed_reply_is_a_502_and_the_next_request_is_served(
    make_worker: MakeWorker, make_router: MakeRouter, reply: bytes
) -> None:
    w = await make_worker("a", cls=RawWorker)
    w.raw, w.close_after = reply, reply.endswith(PARTIAL)  # a short body ends with its connection
    router = await make_router([w.url])
    upstream = router.state.proxy.upstream
    status, raw = await _ask(router.url, {**CHAT, "model": "fake-model"})
    assert status == 502, raw
    err = _error(raw)
    assert err["type"] == "server_error"
    assert err["code"] == ("worker_lost" if reply in BAD_BODIES.values() else "worker_unavailable")
    assert PARTIAL not in raw
    await eventually(lambda: upstream.open == 0, "the connection closed, not pooled")
    if not w.close_after:
        await eventually(lambda: w.closed_by_router == 1, "the router closing the connection")
    w.raw = None  # the worker mends its ways: the next request gets a connection of its own
    status, raw = await _ask(router.url, CHAT)
    assert status == 200 and orjson.loads(raw)["choices"][0]["message"]["content"] == "hello from a"
    assert upstream.open == 1  # that one is pooled
    assert all(x.inflight == 0 for x in router.state.registry.workers.values())


async def test_malformed_head_is_retried_on_another_worker(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    bad = await make_worker("bad", cls=RawWorker)
    bad.raw = BAD_HEADS["two lengths"]
    good = await make_worker("good")
    router = await make_router([bad.url, good.url])
    for i in range(4):  # whichever is chosen first, every answer is whole
        body = {**CHAT, "messages": [{"role": "user", "content": f"session {i}"}]}
        status, raw = await _ask(router.url, body)
        assert status == 200 and orjson.loads(raw)["choices"][0]["message"]["content"]
    assert bad.bodies and len(good.bodies) == 4


async def test_stream_whose_framing_breaks_mid_way_ends_with_an_error_event(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    w = await make_worker("a", cls=RawWorker)
    event = b'data: {"text":"a"}\n\n'
    w.raw = SSE + CHUNKED + b"\r\n" + b"%x\r\n%s\r\n" % (len(event), event) + b"zz\r\n"
    router = await make_router([w.url])
    stream = {"text": "x", "stream": True}
    async with aiohttp.ClientSession() as s, s.post(router.url + "/generate", json=stream) as r:
        assert r.status == 200  # the head and the first event went out before the fault
        events = (await r.read()).split(b"\n\n")
    assert events[0] == b'data: {"text":"a"}'
    error = orjson.loads(events[1][len(b"data: ") :])["error"]
    assert error["code"] == "worker_lost" and "chunk size" in error["message"]
    assert events[2:] == [b"data: [DONE]", b""]
    await eventually(lambda: router.state.proxy.upstream.open == 0, "no connection open")
