"""A worker that plays back the recorded SGLang traffic (tests/fixtures/kv_events) over ZMQ.

Its sockets send the recorded bytes unchanged: an XPUB in place of SGLang's PUB (the same wire;
it also tells the test when a subscriber has joined) sends the live messages, and a ROUTER answers
replay requests with the recorded replay answer's messages, limited, like SGLang's buffer, to what
was published so far. /server_info carries the recorded `kv_events` descriptor with these ports.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import zmq
import zmq.asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.fixtures.kv_events import Message, Recording


def _port(sock: zmq.asyncio.Socket) -> int:
    return int(sock.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])


class RecordedWorker:
    def __init__(self, rec: Recording) -> None:
        self.rec = rec
        self._ctx = zmq.asyncio.Context()
        self.pub = self._ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind("tcp://127.0.0.1:*")
        self.router = self._ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind("tcp://127.0.0.1:*")
        answer = rec.replay(1)
        self._buffer: dict[int, Message] = {m.seq: m for m in answer[:-1]}
        self._end = answer[-1]
        self.published = -1  # the highest seq sent (or lost) so far: what the buffer may hold
        self.payloads: dict[int, bytes] = {}  # seq -> a payload sent instead of the recorded one
        self.unreplayable: set[int] = set()  # seqs the replay buffer no longer holds
        self.replay_starts: list[int] = []
        self._task: asyncio.Task[None] | None = None
        app = web.Application()
        app.router.add_get("/server_info", self._info)
        self.server = TestServer(app, host="127.0.0.1")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    def descriptor(self) -> dict[str, Any]:
        kv = dict(self.rec.metadata["kv_events"])
        kv["endpoint_port_base"] = _port(self.pub)
        kv["replay_endpoint_port_base"] = _port(self.router)
        return kv

    async def _info(self, _: web.Request) -> web.Response:
        return web.json_response({"page_size": self.rec.page_size, "kv_events": self.descriptor()})

    async def start(self) -> RecordedWorker:
        await self.server.start_server()
        self._task = asyncio.get_running_loop().create_task(self._serve_replay())
        return self

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.server.close()
        self.pub.close(0)
        self.router.close(0)
        self._ctx.term()

    async def subscribed(self, timeout_s: float = 5.0) -> None:
        """Wait for a subscriber's subscription message (b"\\x01" + topic)."""
        frames = await asyncio.wait_for(self.pub.recv_multipart(), timeout_s)
        assert frames[0][:1] == b"\x01", frames

    def frames(self, m: Message) -> tuple[bytes, ...]:
        """m's frames as the worker sends them (with a substituted payload, if any)."""
        payload = self.payloads.get(m.seq)
        return m.frames if payload is None else (*m.frames[:-1], payload)

    def published_before_anyone_joined(self, last_seq: int) -> None:
        """Seqs up to last_seq went out before any subscriber: only the replay buffer has them."""
        self.published = max(self.published, last_seq)

    async def send(self, m: Message, *, lost: bool = False) -> None:
        """Publish live message m (lost: it never reaches subscribers, as on a congested link)."""
        assert m.socket == "sub"
        self.published = max(self.published, m.seq)
        if not lost:
            await self.pub.send_multipart(self.frames(m))

    async def _serve_replay(self) -> None:
        while True:
            identity, _, start_b = await self.router.recv_multipart()
            start = int.from_bytes(start_b, "big")
            self.replay_starts.append(start)
            for seq in sorted(self._buffer):
                if start <= seq <= self.published and seq not in self.unreplayable:
                    # recorded DEALER frames [b"", topic, seq, payload]: the ROUTER adds identity
                    await self.router.send_multipart([identity, *self.frames(self._buffer[seq])])
            await self.router.send_multipart([identity, *self._end.frames])
