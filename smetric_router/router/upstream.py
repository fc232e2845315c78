"""A lean HTTP/1.1 client for the proxy's hot path: POST to a worker over pooled keep-alive
connections and read the reply as it comes.

aiohttp's ClientSession costs about a third of the router's CPU per request (request and response
objects, a parser and a writer task per request, cookie and redirect handling); a proxy that sends
one POST to a known worker needs none of it. Everything else (health checks, PD, admin) keeps
aiohttp.

Failures say what the proxy may do next: `Unreachable` when the request never reached the worker
(`refused`: no connection could be made) is safe to send elsewhere; `Reset` when the connection
ended after the request was written but before any reply byte is not (the worker may have run it,
and died of it); `LocalError` when the router itself is out of file descriptors (or of connection
slots, --max-upstream-connections) says nothing about the worker; `Stalled` when the worker sent
no first body byte, or went quiet mid-body, past its bound; asyncio.TimeoutError past the request's
whole deadline; `Lost` when the connection ends inside the body; `Malformed` (a kind of Lost) when
the reply breaks HTTP/1.1 itself.

Replies are parsed by llhttp (httptools), Node.js's parser, with none of its leniencies: a reply
whose framing is in any doubt (a Content-Length that is not plain digits, two of them,
Content-Length with Transfer-Encoding, a bad chunk, a head that is not HTTP/1.x, a protocol switch)
is `Malformed`, and its connection is closed, never pooled. So is a reply that ends before the
length it declared (`Lost`): nothing reaches a client as a whole answer unless all of it came.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import random
import ssl
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import httptools
from yarl import URL

_MAX_HEAD = 64 * 1024
_HIGH_WATER = 256 * 1024  # body bytes buffered before reading from the worker pauses
_IDLE_PER_ORIGIN = 1024
# An idle connection older than this is not reused: SGLang's uvicorn closes keep-alive connections
# after 5 s, and a request written onto one it is closing would look like a worker dying under it.
MAX_IDLE_SECS = 3.0
# Past the first-byte bound, how often a request with Timeouts.alive asks it again.
_RECHECK_SECS = 1.0
# How long a connection is retried while the router is out of file descriptors.
LOCAL_WAIT_SECS = 1.0
# errno values that are the router's own shortage (file descriptors, buffers, local ports), not
# anything the worker did.
LOCAL_ERRNOS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.EADDRNOTAVAIL}
)

# a reply's states: its head awaited (informational heads skipped), its body, all of it read
_HEAD, _BODY, _DONE = range(3)


class UpstreamError(Exception):
    pass


class Unreachable(UpstreamError):
    """Nothing came back: safe to send the request elsewhere."""

    def __init__(self, why: str, refused: bool) -> None:
        super().__init__(why)
        self.refused = refused  # no connection at all (the worker looks down)


class Lost(UpstreamError):
    """The connection ended or broke the protocol inside a response."""


class Malformed(Lost):
    """The reply is not valid HTTP/1.1 (its framing above all): nothing of it can be trusted."""


class _Extra(Exception):
    """Stops the parser at bytes past the end of a reply (see Response.on_message_begin)."""


class Reset(UpstreamError):
    """The connection ended after the request was written, before any reply byte: the worker may
    have accepted and run it (a generation is not idempotent)."""


class LocalError(UpstreamError):
    """The router could not open a connection for reasons of its own (out of file descriptors or
    of connection slots): not the worker's fault."""


class Stalled(UpstreamError):
    """No first body byte within the first-byte bound, or none for the idle bound mid-body."""

    def __init__(self, why: str, first_byte: bool) -> None:
        super().__init__(why)
        self.first_byte = first_byte  # nothing of the body had come yet


def is_local(exc: BaseException) -> bool:
    """Whether an OSError (also one wrapped by aiohttp) is the router's own shortage."""
    seen: BaseException | None = exc
    for _ in range(8):  # a short chain: the error, what aiohttp wraps, their causes
        if seen is None:
            return False
        if isinstance(seen, OSError) and seen.errno in LOCAL_ERRNOS:
            return True
        os_error = getattr(seen, "os_error", None)  # aiohttp.ClientConnectorError
        wrapped = os_error if isinstance(os_error, OSError) and os_error is not seen else None
        seen = wrapped or seen.__cause__
    return False


@dataclass(frozen=True, slots=True)
class Timeouts:
    """One request's bounds in seconds (None: unbounded)."""

    total: float | None  # the whole exchange, body included
    first_byte: float | None = None  # dispatch to the first body byte
    idle: float | None = None  # longest silence between body bytes once the first came
    # Past first_byte, keep waiting while this says the worker is still fine (a non-streamed
    # reply's first byte is its whole answer: a long one is no stall while its worker is healthy).
    alive: Callable[[], bool] | None = None
    not_alive: str = "the worker fails its health checks"  # what alive() saying no means


@dataclass(frozen=True, slots=True)
class _Target:
    origin: tuple[str, str, int]  # scheme, host, port: the pool key
    prefix: bytes  # request line and Host header


class _Conn(asyncio.Protocol):
    def __init__(self, idle: list[_Conn], pool: Upstream) -> None:
        self.transport: asyncio.Transport | None = None
        self.idle = idle  # its origin's idle list
        self.pool = pool
        self.resp: Response | None = None
        self.lost = False
        self.holds_slot = False  # counted in the pool's open connections until it is gone
        self.reused = False
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if self.resp is None:  # bytes nobody asked for: the connection is not reusable
            self.close()
            return
        self.resp.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.holds_slot:
            self.holds_slot = False
            self.pool.slot_freed()
        if self.resp is not None:
            self.resp.feed_lost(exc)
            self.resp = None
        elif self in self.idle:
            self.idle.remove(self)

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()

    def release(self, keep_alive: bool) -> None:
        self.resp = None
        # With requests waiting for a connection slot, an idle one would only hold theirs.
        if (
            keep_alive
            and not self.lost
            and len(self.idle) < _IDLE_PER_ORIGIN
            and not self.pool.has_waiters()
        ):
            self.reused = True
            self.idle_since = self.pool.loop_time()
            self.idle.append(self)
        else:
            self.close()


class Response:
    """A worker's reply: status and headers once awaited from Upstream.post, then the body
    through readany() (an aiohttp.StreamReader's reading surface, for copy_stream).

    It is its own parser's protocol: llhttp calls on_header, on_headers_complete, on_body and
    on_message_complete as the bytes fed to it go by."""

    def __init__(
        self,
        conn: _Conn,
        loop: asyncio.AbstractEventLoop,
        deadline: float | None,
        first_byte_at: float | None = None,
        bounds: Timeouts | None = None,
    ) -> None:
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.content_type = ""
        self._conn: _Conn | None = conn
        self._loop = loop
        self._head: asyncio.Future[None] = loop.create_future()
        # It holds this response's callbacks, a cycle that is broken once the reply is done with
        # (refcounting frees both then, not the cyclic collector).
        self._parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self._state = _HEAD
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self._head_bytes = 0  # fed before the head was complete
        self._until_close = False  # a body without a length: it ends with the connection
        self._body: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._exc: BaseException | None = None
        self._keep_alive = False  # llhttp's word, once the reply is complete
        self._timer = loop.call_at(deadline, self._timed_out) if deadline is not None else None
        self._bounds = bounds or Timeouts(None)
        self._first_timer: asyncio.TimerHandle | None = None
        if first_byte_at is not None:
            self._first_timer = loop.call_at(first_byte_at, self._no_first_byte)
        self._idle = self._bounds.idle
        self._idle_timer: asyncio.TimerHandle | None = None
        self._last_data = 0.0

    # reading side ----------------------------------------------------------------------------

    async def readany(self) -> bytes:
        """The body bytes that have come so far; b"" at its end."""
        while not self._body:
            if self._exc is not None:
                raise self._exc
            if self._state == _DONE:
                return b""
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = self._body.popleft() if len(self._body) == 1 else b"".join(self._body)
        self._body.clear()
        self._buffered = 0
        if self._paused and self._conn is not None and self._conn.transport is not None:
            self._paused = False
            self._last_data = self._loop.time()
            self._conn.transport.resume_reading()
        return data

    async def read(self) -> bytes:
        parts = []
        while chunk := await self.readany():
            parts.append(chunk)
        return b"".join(parts)

    def is_eof(self) -> bool:
        return self._state == _DONE and not self._body

    def has_body(self) -> bool:
        """readany() would answer at once."""
        return bool(self._body) or self._state == _DONE or self._exc is not None

    def close(self) -> None:
        """Done with it: an unfinished reply costs its connection."""
        self._cancel_timers()
        self._parser = None
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.resp = None
            conn.close()

    async def wait_head(self) -> None:
        await self._head

    # feeding side ----------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        parser = self._parser
        if parser is None:  # done with
            return
        body = self._body
        before = len(body)
        try:
            parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as e:
            # What a callback raised comes back as the context of a HttpParserCallbackError.
            if not isinstance(e.__context__, _Extra):
                self._fail(_malformed(e))
                return
            self._keep_alive = False  # bytes past the end of the reply: not reusable
        state = self._state
        if state == _HEAD:
            self._head_bytes += len(data)
            if self._head_bytes > _MAX_HEAD:
                self._fail(Malformed(f"response head over {_MAX_HEAD} bytes"))
            return
        grew = len(body) > before
        if grew:
            self._got_data()
            if self._buffered > _HIGH_WATER and not self._paused and state != _DONE:
                conn = self._conn
                if conn is not None and conn.transport is not None:
                    self._paused = True
                    conn.transport.pause_reading()
        if state == _DONE:
            self._finish()
        if grew or state == _DONE:
            self._wake()

    # llhttp's callbacks (HttpResponseParser's protocol)

    def on_message_begin(self) -> None:
        if self._state == _DONE:  # another reply after this one: nobody asked for it
            raise _Extra

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._state == _HEAD:  # not a chunked body's trailer fields
            self._raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self._parser is not None  # it is calling
        code = self._parser.get_status_code()
        raw, self._raw_headers = self._raw_headers, []
        if code < 200:  # informational: the real head follows (101 ends in HttpParserUpgrade)
            return
        headers = []
        length = chunked = coded = False
        for n, v in raw:
            name, value = n.decode("latin-1"), v.decode("latin-1").strip()
            headers.append((name, value))
            low = name.lower()
            if low == "content-type":
                self.content_type = value.split(";", 1)[0].strip().lower()
            elif low == "content-length":
                length = True
            elif low == "transfer-encoding":
                coded = True
                chunked = value.rsplit(",", 1)[-1].strip().lower() == "chunked"
        self.status, self.headers = code, headers
        # llhttp's own rule (llhttp_message_needs_eof), which httptools does not expose: without
        # a length or a final chunked coding, the body runs until the connection closes.
        self._until_close = code not in (204, 304) and (not chunked if coded else not length)
        self._state = _BODY
        if not self._head.done():
            self._head.set_result(None)

    def on_body(self, data: bytes) -> None:
        self._body.append(data)
        self._buffered += len(data)

    def on_message_complete(self) -> None:
        if self._state == _BODY:  # not an informational reply's end
            assert self._parser is not None  # it is calling
            self._state = _DONE
            self._keep_alive = self._parser.should_keep_alive()

    def feed_lost(self, exc: Exception | None) -> None:
        self._conn = None
        if self._state == _BODY and self._until_close and self._exc is None:
            self._state = _DONE
            self._finish()
            self._wake()
            return
        if self._state == _DONE or self._exc is not None:
            return
        why = str(exc) if exc else "the worker closed the connection"
        if self._state == _HEAD:
            self._fail(Reset(f"the connection ended after the request was sent: {why}"))
        else:
            self._fail(Lost(f"response payload is not completed: {why}"))

    def _timed_out(self) -> None:
        self._timer = None
        self._fail(asyncio.TimeoutError())

    def _got_data(self) -> None:
        if self._first_timer is not None:
            self._first_timer.cancel()
            self._first_timer = None
        if self._idle is not None:
            self._last_data = self._loop.time()
            if self._idle_timer is None:
                due = self._last_data + self._idle
                self._idle_timer = self._loop.call_at(due, self._check_idle)

    def _no_first_byte(self) -> None:
        self._first_timer = None
        alive = self._bounds.alive
        if alive is not None and alive():
            self._first_timer = self._loop.call_later(_RECHECK_SECS, self._no_first_byte)
            return
        why = f"no response byte within {self._bounds.first_byte:g} s"
        if alive is not None:
            why += f" and {self._bounds.not_alive}"
        self._fail(Stalled(why, first_byte=True))

    def _check_idle(self) -> None:
        # One timer per response, moved on lazily: the hot path only notes the time of each read.
        assert self._idle is not None
        self._idle_timer = None
        now = self._loop.time()
        if self._paused:  # it is the client who is not reading: the silence starts on resume
            self._last_data = now
        due = self._last_data + self._idle
        if now < due:
            self._idle_timer = self._loop.call_at(due, self._check_idle)
            return
        self._fail(Stalled(f"the worker sent nothing for {self._idle:g} s", first_byte=False))

    def _cancel_timers(self) -> None:
        for t in (self._timer, self._first_timer, self._idle_timer):
            if t is not None:
                t.cancel()
        self._timer = self._first_timer = self._idle_timer = None

    def _fail(self, exc: BaseException) -> None:
        if self._exc is None:
            self._exc = exc
        if not self._head.done():
            self._head.set_exception(exc)
            self._head.exception()  # retrieved here: nobody may be awaiting it any more
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.resp = None
            conn.close()
        self._cancel_timers()
        self._parser = None
        self._wake()

    def _finish(self) -> None:
        self._cancel_timers()
        self._parser = None
        conn, self._conn = self._conn, None
        if conn is not None:
            if self._paused and conn.transport is not None:
                conn.transport.resume_reading()
            self._paused = False
            conn.release(self._keep_alive)

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)


class Upstream:
    """Keep-alive connection pools, one per worker origin, under one bound on open connections
    (each is a file descriptor): past it, a request waits for a slot within its own deadline."""

    def __init__(
        self,
        connect_timeout: float,
        max_connections: int | None = None,
        max_idle_secs: float = MAX_IDLE_SECS,
    ) -> None:
        self._connect_timeout = connect_timeout
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}
        self._targets: dict[tuple[str, str], _Target] = {}
        self._ssl: ssl.SSLContext | None = None
        self._max = max_connections
        self._max_idle = max_idle_secs
        self.open = 0  # connections open or being opened (slots taken)
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def max_connections(self) -> int | None:
        return self._max

    def waiting(self) -> int:
        return len(self._waiters)

    async def post(
        self,
        base: str,
        path: str,
        headers: bytes,
        body: bytes,
        timeout: float | Timeouts | None,
        trace: bytes = b"",
    ) -> Response:
        """Send `body` to base + path and wait for the reply's head. headers: forwarded header
        lines, each ending in CRLF; trace: the W3C trace-context lines (`traceparent: ...`) of
        this attempt's span, with --enable-trace (core/tracing.py), so that a worker tracing too
        puts its spans under it."""
        t = timeout if isinstance(timeout, Timeouts) else Timeouts(timeout)
        target = self._target(base, path)
        loop = asyncio.get_running_loop()
        now = loop.time()
        deadline = None if t.total is None else now + t.total
        first_at = None if t.first_byte is None else now + t.first_byte
        conn = self._pooled(target.origin, now)
        if conn is None:
            conn = await self._connect(target.origin, loop, _earliest(deadline, first_at))
        if conn.lost or conn.transport is None:  # closed by the worker as soon as it opened
            raise Unreachable(f"{base} closed the connection at once", refused=False)
        resp = Response(conn, loop, deadline, first_at, t)
        conn.resp = resp
        conn.transport.write(
            b"%sContent-Length: %d\r\n%s%s\r\n%s" % (target.prefix, len(body), headers, trace, body)
        )
        try:
            await resp.wait_head()
        except BaseException:
            resp.close()
            raise
        return resp

    def _target(self, base: str, path: str) -> _Target:
        t = self._targets.get((base, path))
        if t is None:
            url = URL(base + path)
            if url.scheme not in ("http", "https") or url.raw_host is None or url.port is None:
                raise ValueError(f"not an http(s) URL: {base + path}")
            request_line = f"POST {url.raw_path_qs} HTTP/1.1\r\n"
            host = f"Host: {url.host_port_subcomponent}\r\n"
            prefix = (request_line + host).encode("latin-1")
            t = self._targets[base, path] = _Target((url.scheme, url.raw_host, url.port), prefix)
        return t

    def _pooled(self, origin: tuple[str, str, int], now: float) -> _Conn | None:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()  # the most recent: the least likely to have been closed
            if conn.lost or conn.transport is None or conn.transport.is_closing():
                continue
            if now - conn.idle_since > self._max_idle:
                conn.close()
                continue
            return conn
        return None

    async def _connect(
        self,
        origin: tuple[str, str, int],
        loop: asyncio.AbstractEventLoop,
        deadline: float | None,
    ) -> _Conn:
        scheme, host, port = origin
        await self.take_slot(loop, deadline)
        idle = self._idle.setdefault(origin, [])
        tls: ssl.SSLContext | None = None
        made: list[_Conn] = []

        def factory() -> _Conn:
            made.append(_Conn(idle, self))
            return made[-1]

        # Out of descriptors: others are freed as requests end (and as the router answers its
        # 503s, which close their client connections), so retry briefly, with jitter so the
        # waiters do not all give up at once, before answering 503.
        give_up = _earliest(deadline, loop.time() + LOCAL_WAIT_SECS)
        backoff = 0.01
        try:
            if scheme == "https":
                tls = self._ssl = self._ssl or ssl.create_default_context()
            while True:
                try:
                    # Not asyncio.wait_for: on Python 3.11 it returns the connection, and
                    # swallows a cancellation, when both come in the same turn of the loop.
                    async with asyncio.timeout(self._connect_timeout):
                        _, conn = await loop.create_connection(factory, host, port, ssl=tls)
                    break
                except OSError as e:
                    pause = backoff * (0.5 + random.random())
                    if not is_local(e) or (give_up is not None and loop.time() + pause > give_up):
                        raise
                    await asyncio.sleep(pause)
                    backoff = min(backoff * 2, 0.2)
        except BaseException as e:
            self.slot_freed()
            if isinstance(e, OSError) and is_local(e):
                raise LocalError(f"cannot open a connection to {host}:{port}: {e}") from None
            if isinstance(e, OSError):
                raise Unreachable(f"cannot connect to {host}:{port}: {e}", refused=True) from None
            raise
        if conn.lost:  # gone already: its slot was never counted as its own
            self.slot_freed()
        else:
            conn.holds_slot = True
        return conn

    async def take_slot(self, loop: asyncio.AbstractEventLoop, deadline: float | None) -> None:
        if self._max is None or (self.open < self._max and not self._waiters):
            self.open += 1
            return
        self._close_oldest_idle()  # its slot comes to the first waiter when it is gone
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        try:
            if deadline is None:
                await waiter
            else:
                async with asyncio.timeout_at(deadline):
                    await waiter
        except BaseException as e:
            if waiter.done() and not waiter.cancelled():
                self.slot_freed()  # handed over as we gave up: pass it on
            else:
                waiter.cancel()
                with contextlib.suppress(ValueError):  # slot_freed may have dropped it already
                    self._waiters.remove(waiter)
            if isinstance(e, TimeoutError):
                raise LocalError(
                    f"all {self._max} upstream connections (--max-upstream-connections) stayed "
                    "busy for the request's whole wait"
                ) from None
            raise

    def _close_oldest_idle(self) -> None:
        oldest: _Conn | None = None
        for idle in self._idle.values():
            for conn in idle:
                if oldest is None or conn.idle_since < oldest.idle_since:
                    oldest = conn
        if oldest is not None:
            oldest.idle.remove(oldest)
            oldest.close()

    def slot_freed(self) -> None:
        """A connection is gone (or was never made): its slot goes to the first waiter."""
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(None)
                return
        self.open -= 1

    def has_waiters(self) -> bool:
        return bool(self._waiters)

    def loop_time(self) -> float:
        return asyncio.get_running_loop().time()

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in list(idle):
                conn.close()
            idle.clear()


def _malformed(e: Exception) -> Malformed:
    if isinstance(e, httptools.HttpParserUpgrade):
        bad = Malformed("the worker switched protocols")
    else:
        bad = Malformed(f"bad response from the worker: {e}")
    bad.__cause__ = e
    return bad


def _earliest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else min(a, b)
