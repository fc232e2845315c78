"""A lean HTTP/1.1 client for the proxy's hot path: POST to a worker over pooled keep-alive
connections and read the reply as it comes.

aiohttp's ClientSession costs about a third of the router's CPU per request (request and response
objects, a parser and a writer task per request, cookie and redirect handling); a proxy that sends
one POST to a known worker needs none of it. Everything else (health checks, PD, admin) keeps
aiohttp.

Failures keep the shapes the proxy retries on: `Unreachable` before any response byte (`refused`:
no connection could be made), asyncio.TimeoutError past the request's deadline (head or body),
`Lost` when the connection ends inside the body.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from dataclasses import dataclass
from typing import cast

from yarl import URL

_MAX_HEAD = 64 * 1024
_HIGH_WATER = 256 * 1024  # body bytes buffered before reading from the worker pauses
_IDLE_PER_ORIGIN = 1024

# body framing states
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _UNTIL_CLOSE, _DONE = range(8)


class UpstreamError(Exception):
    pass


class Unreachable(UpstreamError):
    """Nothing came back: safe to send the request elsewhere."""

    def __init__(self, why: str, refused: bool) -> None:
        super().__init__(why)
        self.refused = refused  # no connection at all (the worker looks down)


class Lost(UpstreamError):
    """The connection ended or broke the protocol inside a response."""


@dataclass(frozen=True, slots=True)
class _Target:
    origin: tuple[str, str, int]  # scheme, host, port: the pool key
    prefix: bytes  # request line and Host header


class _Conn(asyncio.Protocol):
    def __init__(self, idle: list[_Conn]) -> None:
        self.transport: asyncio.Transport | None = None
        self.idle = idle  # its origin's idle list
        self.resp: Response | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if self.resp is None:  # bytes nobody asked for: the connection is not reusable
            self.close()
            return
        self.resp.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
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
        if keep_alive and not self.lost and len(self.idle) < _IDLE_PER_ORIGIN:
            self.idle.append(self)
        else:
            self.close()


class Response:
    """A worker's reply: status and headers once awaited from Upstream.post, then the body
    through readany() (an aiohttp.StreamReader's reading surface, for copy_stream)."""

    def __init__(
        self, conn: _Conn, loop: asyncio.AbstractEventLoop, deadline: float | None
    ) -> None:
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.content_type = ""
        self._conn: _Conn | None = conn
        self._loop = loop
        self._head: asyncio.Future[None] = loop.create_future()
        self._state = _HEAD
        self._remaining = 0
        self._buf = bytearray()
        self._body: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._exc: BaseException | None = None
        self._keep_alive = True
        self._timer = loop.call_at(deadline, self._timed_out) if deadline is not None else None

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
        if self._timer is not None:
            self._timer.cancel()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.resp = None
            conn.close()

    async def wait_head(self) -> None:
        await self._head

    # feeding side ----------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        out: list[bytes] = []
        try:
            self._parse(buf, out)
        except (ValueError, Lost) as e:
            self._fail(e if isinstance(e, Lost) else Lost(f"bad response from the worker: {e}"))
            return
        if out:
            chunk = out[0] if len(out) == 1 else b"".join(out)
            self._body.append(chunk)
            self._buffered += len(chunk)
            if self._buffered > _HIGH_WATER and not self._paused and self._state != _DONE:
                conn = self._conn
                if conn is not None and conn.transport is not None:
                    self._paused = True
                    conn.transport.pause_reading()
        if self._state == _DONE:
            self._finish()
        if out or self._state == _DONE:
            self._wake()

    def _parse(self, buf: bytearray, out: list[bytes]) -> None:
        while buf:
            state = self._state
            if state == _HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > _MAX_HEAD:
                        raise Lost("response head too large")
                    return
                head = bytes(buf[:end]).decode("latin-1")
                del buf[: end + 4]
                self._parse_head(head)
            elif state in (_LENGTH, _CHUNK_DATA):
                n = min(self._remaining, len(buf))
                out.append(bytes(buf[:n]))
                del buf[:n]
                self._remaining -= n
                if not self._remaining:
                    self._state = _DONE if state == _LENGTH else _CHUNK_END
            elif state in (_CHUNK_SIZE, _TRAILER):
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                line = bytes(buf[:end])
                del buf[: end + 2]
                if state == _TRAILER:
                    if not line:
                        self._state = _DONE
                    continue
                size = int(line.split(b";", 1)[0], 16)
                self._remaining = size
                self._state = _CHUNK_DATA if size else _TRAILER
            elif state == _CHUNK_END:
                if len(buf) < 2:
                    return
                if buf[:2] != b"\r\n":
                    raise Lost("bad chunk terminator")
                del buf[:2]
                self._state = _CHUNK_SIZE
            elif state == _UNTIL_CLOSE:
                out.append(bytes(buf))
                buf.clear()
            else:  # bytes past the end of the reply
                self._keep_alive = False
                buf.clear()

    def _parse_head(self, head: str) -> None:
        lines = head.split("\r\n")
        version, status, *_ = lines[0].split(" ", 2)
        if not version.startswith("HTTP/1."):
            raise Lost(f"not an HTTP/1 response: {lines[0][:80]!r}")
        code = int(status)
        if 100 <= code < 200:  # informational: the real head follows
            return
        headers = []
        length: int | None = None
        chunked = False
        keep_alive = version != "HTTP/1.0"
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise Lost(f"bad header line {line[:80]!r}")
            name, value = name.strip(), value.strip()
            headers.append((name, value))
            low = name.lower()
            if low == "content-length":
                length = int(value)
            elif low == "transfer-encoding":
                chunked = value.lower().endswith("chunked")
            elif low == "connection":
                keep_alive = value.lower() == "keep-alive" or (
                    keep_alive and value.lower() != "close"
                )
            elif low == "content-type":
                self.content_type = value.split(";", 1)[0].strip().lower()
        self.status, self.headers, self._keep_alive = code, headers, keep_alive
        if code in (204, 304):
            self._state = _DONE
        elif chunked:
            self._state = _CHUNK_SIZE
        elif length is not None:
            self._remaining = length
            self._state = _LENGTH if length else _DONE
        else:
            self._state = _UNTIL_CLOSE
            self._keep_alive = False
        if not self._head.done():
            self._head.set_result(None)

    def feed_lost(self, exc: Exception | None) -> None:
        self._conn = None
        if self._state == _UNTIL_CLOSE:
            self._state = _DONE
            self._finish()
            self._wake()
            return
        if self._state == _DONE or self._exc is not None:
            return
        why = str(exc) if exc else "the worker closed the connection"
        if self._state == _HEAD:
            self._fail(Unreachable(why, refused=False))
        else:
            self._fail(Lost(f"response payload is not completed: {why}"))

    def _timed_out(self) -> None:
        self._timer = None
        self._fail(asyncio.TimeoutError())

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
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._wake()

    def _finish(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        conn, self._conn = self._conn, None
        if conn is not None:
            if self._paused and conn.transport is not None:
                conn.transport.resume_reading()
            self._paused = False
            conn.release(self._keep_alive and not self._buf)

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)


class Upstream:
    """Keep-alive connection pools, one per worker origin."""

    def __init__(self, connect_timeout: float) -> None:
        self._connect_timeout = connect_timeout
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}
        self._targets: dict[tuple[str, str], _Target] = {}
        self._ssl: ssl.SSLContext | None = None

    async def post(
        self, base: str, path: str, headers: bytes, body: bytes, timeout: float | None
    ) -> Response:
        """Send `body` to base + path and wait for the reply's head. headers: forwarded header
        lines, each ending in CRLF."""
        target = self._target(base, path)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        conn = self._pooled(target.origin)
        if conn is None:
            conn = await self._connect(target.origin, loop)
        if conn.lost or conn.transport is None:  # closed by the worker as soon as it opened
            raise Unreachable(f"{base} closed the connection at once", refused=False)
        resp = Response(conn, loop, deadline)
        conn.resp = resp
        conn.transport.write(
            b"%sContent-Length: %d\r\n%s\r\n%s" % (target.prefix, len(body), headers, body)
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

    def _pooled(self, origin: tuple[str, str, int]) -> _Conn | None:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()  # the most recent: the least likely to have been closed
            if not conn.lost and conn.transport is not None and not conn.transport.is_closing():
                return conn
        return None

    async def _connect(
        self, origin: tuple[str, str, int], loop: asyncio.AbstractEventLoop
    ) -> _Conn:
        scheme, host, port = origin
        idle = self._idle.setdefault(origin, [])
        tls: ssl.SSLContext | None = None
        if scheme == "https":
            tls = self._ssl = self._ssl or ssl.create_default_context()
        try:
            connecting = loop.create_connection(lambda: _Conn(idle), host, port, ssl=tls)
            _, conn = await asyncio.wait_for(connecting, self._connect_timeout)
        except OSError as e:
            raise Unreachable(f"cannot connect to {host}:{port}: {e}", refused=True) from None
        return conn

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in list(idle):
                conn.close()
            idle.clear()
