"""benchmarks.compare's reads of a router's and the workers' counters outlive one stalled read."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from benchmarks.compare import _get

REPLY = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


@pytest.fixture
def stalls_first() -> Iterator[str]:
    """A server on loopback that never answers its first connection and answers the next."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def serve() -> None:
        with server:
            first, _ = server.accept()
            held.append(first)  # read nothing, answer nothing
            conn, _ = server.accept()
            with conn, contextlib.suppress(OSError):
                conn.recv(65536)
                conn.sendall(REPLY)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    address = server.getsockname()[:2]
    yield f"http://127.0.0.1:{address[1]}/metrics"
    if thread.is_alive():  # no second read came: let the server finish
        with contextlib.suppress(OSError):
            socket.create_connection(address).close()
    thread.join(timeout=5)
    for s in held:
        s.close()


def test_a_read_that_times_out_is_tried_again(stalls_first: str) -> None:
    assert _get(stalls_first, timeout=0.3) == (200, b"ok")


def test_a_read_that_times_out_every_time_still_fails(stalls_first: str) -> None:
    with pytest.raises((TimeoutError, OSError)):
        _get(stalls_first, timeout=0.3, attempts=1)
