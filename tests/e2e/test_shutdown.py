"""Graceful shutdown (--shutdown-grace-secs): on SIGTERM the router goes unready at once, refuses
new requests, lets open streams finish within the grace, ends the rest (streams with an SSE error
event, requests still waiting for their worker with 503) and exits 0. With --processes N each
replica drains the same way."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from smetric_router.launch import ClusterSpec, RouterSpec, Stack, WorkerSpec
from smetric_router.router.drain import SHUTDOWN_CODE
from tests.e2e.conftest import ROUTER_ARGS
from tests.e2e.raw import fault
from tests.helpers.polling import eventually
from tests.launch.test_launcher_process import _alive

GRACE_S = 3.0
# Real time (speedup 1): the emulated H20 decodes about 100 tokens/s for one request.
MODEL = "qwen3-coder-30b-a3b-emulated"
SHORT_TOKENS = 120  # ~1.2 s: ends within the grace
LONG_TOKENS = 3000  # ~30 s: outlives it
EXIT_BOUND_S = 10.0  # after the grace: ended requests answer, then the process exits


def _stack(*router_args: str) -> Stack:
    grace = ("--shutdown-grace-secs", str(GRACE_S))
    spec = ClusterSpec(
        router=RouterSpec(port=0, extra_args=(*ROUTER_ARGS, *grace, *router_args)),
        workers=WorkerSpec(count=1, speedup=1.0),
    )
    return Stack(spec)


@pytest.fixture
def stack() -> Iterator[Stack]:
    with _stack() as s:
        yield s


@pytest.fixture
def replicated() -> Iterator[Stack]:
    with _stack("--processes", "2") as s:
        yield s


def _router(stack: Stack) -> subprocess.Popen[bytes]:
    proc = next(c.proc for c in stack.children if c.name == "router")
    assert proc is not None
    return proc


def _chat(max_tokens: int, stream: bool) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"count to {max_tokens}"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


class Stream:
    """An open SSE response, read to its end in the background."""

    def __init__(self, http: aiohttp.ClientSession, url: str, max_tokens: int) -> None:
        self.events: list[str] = []
        self.first = asyncio.Event()
        self.ended_at: float | None = None
        self.task = asyncio.create_task(self._read(http, url, max_tokens))

    async def _read(self, http: aiohttp.ClientSession, url: str, max_tokens: int) -> None:
        # a connection of its own, as separate clients have (and so replicas share them out)
        async with http.post(
            f"{url}/v1/chat/completions",
            json=_chat(max_tokens, True),
            headers={"Connection": "close"},
        ) as r:
            assert r.status == 200, await r.text()
            async for line in r.content:
                if line.startswith(b"data: "):
                    self.events.append(line[6:].decode().strip())
                    self.first.set()
        self.ended_at = time.monotonic()

    @property
    def open(self) -> bool:
        """Still being read: its end has not come."""
        return self.ended_at is None

    async def ended(self) -> list[str]:
        await asyncio.wait_for(self.task, GRACE_S + EXIT_BOUND_S)
        return self.events


def _assert_ended_by_shutdown(events: list[str]) -> None:
    assert events[-1] == "[DONE]", events[-3:]
    error = json.loads(events[-2])["error"]
    assert error["code"] == SHUTDOWN_CODE and error["type"] == "server_error", error
    assert "shut down" in error["message"]
    assert all("error" not in e for e in events[:-2])  # tokens until then, passed through


async def _inflight(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(f"{url}/workers") as r:
        return sum(int(w["inflight"]) for w in (await r.json())["workers"])


async def _wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> int:
    await eventually(lambda: proc.poll() is not None, "the router's exit", timeout)
    return proc.returncode


async def test_sigterm_drains_open_streams_then_ends_the_rest(stack: Stack) -> None:
    url, worker = stack.url, stack.worker_urls[0]
    async with aiohttp.ClientSession() as http:
        long = Stream(http, url, LONG_TOKENS)
        short = Stream(http, url, SHORT_TOKENS)
        await asyncio.wait_for(asyncio.gather(long.first.wait(), short.first.wait()), 30)
        # a non-streaming request the worker holds without an answer
        await fault(http, worker, stall=True)
        held = asyncio.create_task(http.post(f"{url}/v1/chat/completions", json=_chat(8, False)))
        await eventually(lambda: _three(http, url), "3 requests in flight")
        assert short.open  # still streaming when the signal comes

        router = _router(stack)
        router.send_signal(signal.SIGTERM)
        signalled = time.monotonic()

        async def unready() -> bool:
            async with http.get(f"{url}/readiness") as r:
                return r.status == 503 and (await r.json())["status"] == "draining"

        await eventually(unready, "/readiness 503", timeout=2.0)
        async with http.post(f"{url}/v1/chat/completions", json=_chat(8, False)) as r:
            assert r.status == 503
            assert (await r.json())["error"]["code"] == SHUTDOWN_CODE

        # the short stream ends normally within the grace
        events = await short.ended()
        assert events[-1] == "[DONE]" and all("error" not in e for e in events), events[-3:]
        assert short.ended_at is not None and short.ended_at - signalled < GRACE_S

        # the long one is ended by the router once the grace is over
        _assert_ended_by_shutdown(await long.ended())
        assert long.ended_at is not None and long.ended_at - signalled >= GRACE_S - 0.1

        # the held request gets a 503 in OpenAI's shape
        resp = await asyncio.wait_for(held, EXIT_BOUND_S)
        assert resp.status == 503
        assert (await resp.json())["error"]["code"] == SHUTDOWN_CODE
        resp.release()

        assert await _wait_exit(router, GRACE_S + EXIT_BOUND_S) == 0


async def _three(http: aiohttp.ClientSession, url: str) -> bool:
    return await _inflight(http, url) == 3


async def test_sigterm_without_open_requests_exits_at_once(stack: Stack) -> None:
    router = _router(stack)
    router.send_signal(signal.SIGTERM)
    started = time.monotonic()
    assert await _wait_exit(router, GRACE_S + EXIT_BOUND_S) == 0
    assert time.monotonic() - started < GRACE_S  # no grace to wait out


async def test_each_replica_drains(replicated: Stack) -> None:
    url = replicated.url
    router = _router(replicated)
    replicas = [
        int(p)
        for p in subprocess.run(
            ["pgrep", "-P", str(router.pid)], capture_output=True, text=True, check=False
        ).stdout.split()
    ]
    assert len(replicas) == 1
    async with aiohttp.ClientSession() as http:
        # one connection each: the kernel spreads them over both replicas
        streams = [Stream(http, url, LONG_TOKENS) for _ in range(6)]
        await asyncio.wait_for(asyncio.gather(*(s.first.wait() for s in streams)), 30)
        router.send_signal(signal.SIGTERM)

        async def all_unready() -> bool:
            codes = set()
            for _ in range(10):  # new connections: both replicas answer
                async with http.get(f"{url}/readiness", headers={"Connection": "close"}) as r:
                    codes.add(r.status)
            return codes == {503}

        await eventually(all_unready, "every replica unready", timeout=2.0)
        for s in streams:
            _assert_ended_by_shutdown(await s.ended())
    assert await _wait_exit(router, GRACE_S + EXIT_BOUND_S) == 0
    assert not [p for p in replicas if _alive(p)]


@pytest.fixture
def fast() -> Iterator[Stack]:
    spec = ClusterSpec(
        router=RouterSpec(port=0, extra_args=(*ROUTER_ARGS, "--shutdown-grace-secs", str(GRACE_S))),
        workers=WorkerSpec(count=1, speedup=200.0),
    )
    with Stack(spec) as s:
        yield s


def _router_sending(proc: subprocess.Popen[bytes]) -> int:
    """Bytes the router's sockets hold unsent (the kernel's send queues), from /proc."""
    inodes = set()
    fd_dir = f"/proc/{proc.pid}/fd"
    for fd in os.listdir(fd_dir):
        with contextlib.suppress(OSError):
            target = os.readlink(f"{fd_dir}/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    queued = 0
    with open(f"/proc/{proc.pid}/net/tcp") as f:
        for line in f.readlines()[1:]:
            cols = line.split()
            if cols[9] in inodes:
                queued += int(cols[4].split(":")[0], 16)  # tx_queue
    return queued


async def test_a_client_that_stops_reading_does_not_hold_the_shutdown(fast: Stack) -> None:
    """The grace also ends a stream the router is stuck writing to (its client reads nothing):
    the router exits within the bound instead of waiting on the client for ever."""
    host, port = fast.url.removeprefix("http://").split(":")
    body = json.dumps(_chat(200_000, True)).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.connect((host, int(port)))
    try:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        assert sock.recv(1024).startswith(b"HTTP/1.1 200")  # then it reads nothing more
        router = _router(fast)
        await eventually(
            lambda: _router_sending(router) > 64 << 10,
            "the router's send queue to the client filling up",
            timeout=30.0,
        )
        router.send_signal(signal.SIGTERM)
        assert await _wait_exit(router, GRACE_S + EXIT_BOUND_S) == 0
    finally:
        sock.close()
