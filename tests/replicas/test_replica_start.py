"""A replica joining a port other replicas serve (`--processes N` starts them so) takes no
connection before it can route: bound early, the kernel would hand it a share of the port's
connections, answered 503 while the others' /readiness said 200."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from pathlib import Path

import aiohttp
from aiohttp import web

from smetric_router.core.port_file import read_port_file
from tests.helpers.polling import eventually
from tests.router.fakes import FakeWorker, free_port


class StartingWorker(FakeWorker):
    """A worker still starting: /server_info answers 503 until `up`. Counts the router's
    calls, to know the replica has seen it."""

    up = False
    calls = 0

    async def _server_info(self, request: web.Request) -> web.Response:
        self.calls += 1
        return await super()._server_info(request) if self.up else web.Response(status=503)


def accepts(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


async def start_replica(
    worker: FakeWorker, port: int, port_file: Path, stderr: int | None = None
) -> asyncio.subprocess.Process:
    """One router process on `port` with SO_REUSEPORT, as `--processes` starts its replicas."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "smetric_router", "--worker-urls", worker.url,
        "--health-check-interval-secs", "0.1", "--port", str(port), "--reuse-port",
        "--port-file", str(port_file), env=dict(os.environ), stderr=stderr,
    )  # fmt: skip


async def test_a_replica_binds_the_shared_port_only_once_ready(tmp_path: Path) -> None:
    worker = StartingWorker("w0")
    await worker.start()
    port, port_file = free_port(), tmp_path / "port"
    proc = await start_replica(worker, port, port_file)
    try:
        await eventually(lambda: worker.calls >= 3, "the replica asking its worker")
        assert proc.returncode is None
        assert not accepts(port) and read_port_file(port_file) is None
        worker.up = True
        await eventually(lambda: read_port_file(port_file) is not None, "the port bound")
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{port}/readiness") as r:
                assert r.status == 200
            async with s.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r:
                assert r.status == 200
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        await proc.wait()
        await worker.close()


async def test_a_replica_stopped_before_ready_never_binds(tmp_path: Path) -> None:
    worker = StartingWorker("w0")
    await worker.start()
    port, port_file = free_port(), tmp_path / "port"
    proc = await start_replica(worker, port, port_file, stderr=asyncio.subprocess.PIPE)
    try:
        await eventually(lambda: worker.calls >= 3, "the replica asking its worker")
        proc.terminate()
        _, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        assert b"stopped before ready; the port was never bound" in err
        assert read_port_file(port_file) is None
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        await proc.wait()
        await worker.close()
