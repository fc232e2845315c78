"""A TCP proxy that can freeze: connections stay open but nothing more is forwarded either way,
and new connections are accepted and then left silent (a hung middlebox, a stalled peer)."""

from __future__ import annotations

import asyncio
import contextlib


class FrozenProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.frozen = False
        self.accepted = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def freeze(self) -> None:
        self.frozen = True

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in self._writers:
            w.close()
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await t

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._writers.append(writer)
        if self.frozen:
            return  # accepted, never answered
        up_reader, up_writer = await asyncio.open_connection(*self._target)
        self._writers.append(up_writer)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.get_running_loop().create_task(self._pipe(src, dst))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while True:
                data = await src.read(65536)
                if not data:
                    break
                while self.frozen:  # hold what was read: the peer sees silence, not a close
                    await asyncio.sleep(3600)
                dst.write(data)
                await dst.drain()
        dst.close()
