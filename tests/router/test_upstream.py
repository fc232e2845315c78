"""The proxy's own HTTP/1.1 client against a scripted raw server: framing, reuse, failures."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import AsyncIterator
from typing import Any

import pytest

from smetric_router.router.upstream import (
    LocalError,
    Lost,
    Malformed,
    Reset,
    Stalled,
    Timeouts,
    Unreachable,
    Upstream,
    UpstreamError,
)
from tests.helpers.polling import eventually

# Reads one request head and body, then writes the scripted reply in pieces (None: pause).
Script = list[bytes | None]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head + await reader.readexactly(length)


class Serve:
    """Starts a raw server per call that answers its connections from a list of scripts."""

    def __init__(self) -> None:
        self.servers: list[asyncio.Server] = []
        self.seen: list[bytes] = []  # every request the servers read, in order
        self.connections = 0  # connections the servers accepted

    async def __call__(self, replies: list[Script]) -> str:
        queue = list(replies)
        seen = self.seen

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                while queue:
                    seen.append(await _read_request(reader))
                    for piece in queue.pop(0):
                        if piece is None:
                            await asyncio.sleep(0.05)
                        else:
                            writer.write(piece)
                            await writer.drain()
                    if queue and queue[0] == [b"close"]:
                        queue.pop(0)
                        break
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.servers.append(server)
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    started = Serve()
    yield started
    for s in started.servers:
        s.close()


OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"


async def test_chunked_reply_split_anywhere_reassembles(serve: Serve) -> None:
    body = b"3\r\nabc\r\n5;ext=1\r\nde\r\nf\r\n0\r\nTrailer: x\r\n\r\n"
    pieces: Script = [OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"]
    pieces += [body[i : i + 1] for i in range(len(body))]
    url = await serve([pieces, [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"]])
    up = Upstream(connect_timeout=5)
    resp = await up.post(url, "/x", b"X-A: 1\r\n", b"{}", timeout=5)
    assert resp.status == 200 and resp.content_type == "text/event-stream"
    assert ("X-A", "1") not in resp.headers  # a response header, not the request's
    assert await resp.read() == b"abcde\r\nf"
    assert resp.is_eof()
    resp.close()
    # The connection went back to the pool and serves the next request.
    again = await up.post(url, "/y", b"", b"{}", timeout=5)
    assert await again.read() == b"hi"
    assert len(serve.seen) == 2
    assert serve.seen[1].startswith(b"POST /y HTTP/1.1\r\nHost: 127.0.0.1:")
    up.close()


async def test_informational_head_is_skipped_and_length_body_streams(serve: Serve) -> None:
    url = await serve(
        [
            [
                b"HTTP/1.1 100 Continue\r\n\r\n",
                OK_HEAD + b"Content-Length: 6\r\n\r\nabc",
                None,
                b"def",
            ]
        ]
    )
    up = Upstream(connect_timeout=5)
    resp = await up.post(url, "/x", b"", b"{}", timeout=5)
    assert resp.status == 200
    assert await resp.readany() == b"abc"
    assert not resp.is_eof()
    assert await resp.readany() == b"def"
    assert resp.is_eof() and await resp.readany() == b""
    up.close()


async def test_refused_connection_is_unreachable_and_refused() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(Unreachable) as e:
        await Upstream(connect_timeout=5).post(f"http://127.0.0.1:{port}", "/", b"", b"", 5)
    assert e.value.refused


async def test_close_after_the_request_before_any_byte_is_a_reset(serve: Serve) -> None:
    # The worker read the request, then went: it may have run it, so this is no "Unreachable"
    # that the proxy could send elsewhere.
    url = await serve([[]])  # reads the request, answers nothing, closes
    with pytest.raises(Reset):
        await Upstream(connect_timeout=5).post(url, "/", b"", b"{}", 5)


async def test_close_inside_the_body_is_lost(serve: Serve) -> None:
    url = await serve([[OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"]])
    resp = await Upstream(connect_timeout=5).post(url, "/", b"", b"{}", 5)
    assert await resp.readany() == b"abc"
    with pytest.raises(Lost):
        await resp.readany()


async def test_deadline_covers_head_and_body(serve: Serve) -> None:
    url = await serve([[None, None, None, OK_HEAD + b"Content-Length: 1\r\n\r\nx"]])
    with pytest.raises(asyncio.TimeoutError):
        await Upstream(connect_timeout=5).post(url, "/", b"", b"{}", timeout=0.05)
    url = await serve([[OK_HEAD + b"Content-Length: 2\r\n\r\nx", None, None, None, b"y"]])
    resp = await Upstream(connect_timeout=5).post(url, "/", b"", b"{}", timeout=0.08)
    assert await resp.readany() == b"x"
    with pytest.raises(asyncio.TimeoutError):
        await resp.readany()


async def test_reply_until_close_ends_cleanly(serve: Serve) -> None:
    url = await serve([[b"HTTP/1.1 200 OK\r\n\r\nall of it"], [b"close"]])
    resp = await Upstream(connect_timeout=5).post(url, "/", b"", b"{}", 5)
    assert await resp.read() == b"all of it"


async def test_idle_connection_closed_by_the_worker_is_not_reused(serve: Serve) -> None:
    one: Script = [b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na"]
    url = await serve([one, [b"close"], [b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nb"]])
    up = Upstream(connect_timeout=5)
    assert await (await up.post(url, "/", b"", b"{}", 5)).read() == b"a"
    await asyncio.sleep(0.05)  # the worker closed its side of the idle connection
    assert await (await up.post(url, "/", b"", b"{}", 5)).read() == b"b"
    up.close()


# bounds on a silent worker, the connection bound, stale keep-alive, local errors ----------------

CHUNKED = OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"


async def test_first_byte_bound_covers_head_and_first_body_byte(serve: Serve) -> None:
    bound = Timeouts(total=5, first_byte=0.08)
    url = await serve([[None, None, None, CHUNKED + b"1\r\na\r\n0\r\n\r\n"]])
    with pytest.raises(Stalled) as e:  # no head in time
        await Upstream(connect_timeout=5).post(url, "/", b"", b"{}", bound)
    assert e.value.first_byte and "0.08 s" in str(e.value)
    url = await serve([[CHUNKED, None, None, None, b"1\r\na\r\n0\r\n\r\n"]])
    resp = await Upstream(connect_timeout=5).post(url, "/", b"", b"{}", bound)
    with pytest.raises(Stalled):  # a head, then silence: a stream whose first token never came
        await resp.readany()


async def test_idle_bound_trips_on_silence_only(serve: Serve) -> None:
    bound = Timeouts(total=5, first_byte=5, idle=0.12)
    # Steady chunks 0.05 s apart, longer in all than the idle bound: never tripped.
    steady: Script = [CHUNKED]
    for _ in range(5):
        steady += [b"1\r\na\r\n", None]
    url = await serve([[*steady, b"0\r\n\r\n"]])
    resp = await Upstream(connect_timeout=5).post(url, "/", b"", b"{}", bound)
    assert await resp.read() == b"aaaaa"
    url = await serve([[CHUNKED, b"1\r\na\r\n", None, None, None, None, b"1\r\nb\r\n0\r\n\r\n"]])
    resp = await Upstream(connect_timeout=5).post(url, "/", b"", b"{}", bound)
    assert await resp.readany() == b"a"
    with pytest.raises(Stalled) as e:
        await resp.readany()
    assert not e.value.first_byte


async def test_requests_past_the_connection_bound_queue_for_a_slot(serve: Serve) -> None:
    slow: Script = [OK_HEAD + b"Content-Length: 2\r\n\r\nx", None, None, b"y"]
    url = await serve([slow, [b"close"]])
    url2 = await serve([[b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nz"]])
    up = Upstream(connect_timeout=5, max_connections=1)
    first = await up.post(url, "/", b"", b"{}", 5)
    second = asyncio.create_task(up.post(url2, "/", b"", b"{}", 5))
    await asyncio.sleep(0)
    while not up.waiting():
        await asyncio.sleep(0.005)
    assert up.open == 1 and not second.done()
    assert await first.read() == b"xy"  # its connection goes idle, then closes for the waiter
    assert await (await second).read() == b"z"
    assert up.open == 1 and up.waiting() == 0
    up.close()


async def test_waiting_for_a_slot_past_the_deadline_is_a_local_error(serve: Serve) -> None:
    url = await serve([[OK_HEAD + b"Content-Length: 1\r\n\r\n", None, None, None, b"x"]])
    up = Upstream(connect_timeout=5, max_connections=1)
    first = await up.post(url, "/", b"", b"{}", 5)
    with pytest.raises(LocalError):
        await up.post(url, "/", b"", b"{}", Timeouts(total=5, first_byte=0.05))
    assert up.waiting() == 0
    assert await first.read() == b"x"
    up.close()


async def test_stale_idle_connection_is_not_reused(serve: Serve) -> None:
    one: Script = [b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na"]
    url = await serve([one, [b"close"], one])
    up = Upstream(connect_timeout=5, max_idle_secs=0.05)
    assert await (await up.post(url, "/", b"", b"{}", 5)).read() == b"a"
    await asyncio.sleep(0.1)  # idle past max_idle_secs (a worker may be closing it right now)
    assert await (await up.post(url, "/", b"", b"{}", 5)).read() == b"a"
    assert len(serve.seen) == 2
    up.close()


async def test_out_of_descriptors_is_a_local_error_and_frees_its_slot(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    one: Script = [b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na"]
    url = await serve([one, one])  # keeps its connection open for a second request
    other = await serve([])  # never reached: no descriptor for it
    loop = asyncio.get_running_loop()
    real = loop.create_connection
    failures = [3]  # the first tries find no descriptor; then one is freed

    async def connect(*args: Any, **kw: Any) -> tuple[asyncio.Transport, asyncio.BaseProtocol]:
        if failures[0]:
            failures[0] -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return await real(*args, **kw)

    monkeypatch.setattr(loop, "create_connection", connect)
    up = Upstream(connect_timeout=5, max_connections=4)
    assert await (await up.post(url, "/", b"", b"{}", 5)).read() == b"a"  # retried in time
    failures[0] = 1000
    with pytest.raises(LocalError, match="Too many open files"):
        await up.post(other, "/", b"", b"{}", Timeouts(total=0.2))
    assert up.open == 1  # the pooled connection only; the failed one gave its slot back
    up.close()


# framing: llhttp with no leniency; a malformed reply closes its connection ---------------------

JSON_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
GOOD: Script = [JSON_HEAD + b"Content-Length: 2\r\n\r\nok"]
MALFORMED = {
    # read as 10 by int(), it cut the body to a 200 with `{"id": "x"`
    "length with an underscore": JSON_HEAD + b'Content-Length: 1_0\r\n\r\n{"id": "x"}',
    "negative length": JSON_HEAD + b'Content-Length: -1\r\n\r\n{"id": "x"}',
    "signed length": JSON_HEAD + b'Content-Length: +11\r\n\r\n{"id": "x"}',
    "length in hex": JSON_HEAD + b'Content-Length: 0xb\r\n\r\n{"id": "x"}',
    "two lengths": JSON_HEAD + b'Content-Length: 10\r\nContent-Length: 11\r\n\r\n{"id": "x"}',
    "a list of lengths": JSON_HEAD + b'Content-Length: 11, 11\r\n\r\n{"id": "x"}',
    "chunked and a length": JSON_HEAD
    + b'Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\nb\r\n{"id": "x"}\r\n0\r\n\r\n',
    "a length and chunked": JSON_HEAD
    + b'Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\nb\r\n{"id": "x"}\r\n0\r\n\r\n',
    "bad chunk size": JSON_HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "chunk without its CRLF": JSON_HEAD + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}XX0\r\n\r\n",
    "junk status line": b"HTTP/1.1 2OO OK\r\nContent-Length: 2\r\n\r\nok",
    "not HTTP at all": b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
    "HTTP/2 preface": b"HTTP/2 200\r\ncontent-length: 2\r\n\r\nok",
    "bare LF line ends": b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
    "folded header": JSON_HEAD + b"X-A: 1\r\n 2\r\nContent-Length: 2\r\n\r\nok",
    "space before the colon": JSON_HEAD + b"Content-Length : 2\r\n\r\nok",
    "switching protocols": b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n"
    b"Connection: Upgrade\r\n\r\nok",
}


async def _exchange(up: Upstream, url: str) -> tuple[int, bytes] | UpstreamError:
    """The status and whole body, or the error the client raised."""
    try:
        resp = await up.post(url, "/", b"", b"{}", 5)
        try:
            return resp.status, await resp.read()
        finally:
            resp.close()
    except UpstreamError as e:
        return e


@pytest.mark.parametrize("reply", MALFORMED.values(), ids=MALFORMED.keys())
async def test_malformed_reply_is_an_error_and_its_connection_is_closed(
    serve: Serve, reply: bytes
) -> None:
    url = await serve([[reply], GOOD])  # the worker keeps the connection open for more
    up = Upstream(connect_timeout=5)
    outcome = await _exchange(up, url)
    assert isinstance(outcome, Malformed), outcome
    await eventually(lambda: up.open == 0, "the connection closed, not pooled")
    # The next request gets a connection of its own and its answer, whole.
    assert await _exchange(up, url) == (200, b"ok")
    assert serve.connections == 2
    up.close()


async def test_head_growing_past_its_bound_is_an_error(serve: Serve) -> None:
    pad = JSON_HEAD + b"X-Pad: " + b"a" * 70_000
    url = await serve([[pad, None, b"\r\nContent-Length: 2\r\n\r\nok"]])
    outcome = await _exchange(Upstream(connect_timeout=5), url)
    assert isinstance(outcome, Malformed) and "head over" in str(outcome)


async def test_malformed_reply_split_byte_by_byte_is_still_an_error(serve: Serve) -> None:
    reply = MALFORMED["two lengths"]
    url = await serve([[reply[i : i + 1] for i in range(len(reply))]])
    assert isinstance(await _exchange(Upstream(connect_timeout=5), url), Malformed)


async def test_reply_ending_before_its_length_is_lost_not_short(serve: Serve) -> None:
    url = await serve([[JSON_HEAD + b'Content-Length: 20\r\n\r\n{"id": "x"'], [b"close"], GOOD])
    up = Upstream(connect_timeout=5)
    resp = await up.post(url, "/", b"", b"{}", 5)
    assert resp.status == 200  # the head was fine; the body never all came
    with pytest.raises(Lost, match="not completed"):
        await resp.read()
    resp.close()
    assert await _exchange(up, url) == (200, b"ok")
    up.close()


async def test_chunked_reply_ending_before_its_last_chunk_is_lost(serve: Serve) -> None:
    url = await serve([[CHUNKED + b'b\r\n{"id": "x"}\r\n'], [b"close"]])
    outcome = await _exchange(Upstream(connect_timeout=5), url)
    assert isinstance(outcome, Lost) and not isinstance(outcome, Malformed)


async def test_bytes_past_the_end_of_a_reply_keep_its_connection_out_of_the_pool(
    serve: Serve,
) -> None:
    url = await serve([[JSON_HEAD + b"Content-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n"], GOOD])
    up = Upstream(connect_timeout=5)
    assert await _exchange(up, url) == (200, b"ok")  # the reply itself was whole
    assert await _exchange(up, url) == (200, b"ok")
    assert serve.connections == 2
    up.close()


async def test_keep_alive_follows_the_reply(serve: Serve) -> None:
    # HTTP/1.0 and Connection: close end the connection after the reply; HTTP/1.1 keeps it.
    closing: list[Script] = [
        [b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"],
        [b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"],
    ]
    for reply in closing:
        url = await serve([reply, GOOD])
        up = Upstream(connect_timeout=5)
        assert await _exchange(up, url) == (200, b"ok")
        assert await _exchange(up, url) == (200, b"ok")
        up.close()
    assert serve.connections == 4
    url = await serve([GOOD, GOOD])
    up = Upstream(connect_timeout=5)
    for _ in range(2):
        assert await _exchange(up, url) == (200, b"ok")
    assert serve.connections == 5
    up.close()


async def test_no_content_reply_has_no_body_whatever_its_length(serve: Serve) -> None:
    url = await serve([[b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n"], GOOD])
    up = Upstream(connect_timeout=5)
    assert await _exchange(up, url) == (204, b"")
    assert await _exchange(up, url) == (200, b"ok")
    assert serve.connections == 1
    up.close()


async def test_cancelled_as_its_connection_is_made_the_request_ends(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Python 3.11's asyncio.wait_for returned the connection here, swallowing the cancellation:
    # the request went on waiting for a reply nobody would read.
    url = await serve([[None, None, None, *GOOD]])
    loop = asyncio.get_running_loop()
    real = loop.create_connection
    up = Upstream(connect_timeout=5)
    caller: list[asyncio.Task[Any]] = []

    async def connect(*args: Any, **kw: Any) -> tuple[asyncio.Transport, asyncio.BaseProtocol]:
        made = await real(*args, **kw)
        caller[0].cancel()  # the cancellation and the connection in the same turn
        return made

    monkeypatch.setattr(loop, "create_connection", connect)
    caller.append(asyncio.create_task(up.post(url, "/", b"", b"{}", 5)))
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(caller[0]), 2)
    await eventually(lambda: up.open == 0, "no connection open")
