"""A router as its own process, started from an async test whose event loop keeps serving (its
in-test fake workers answer the router's start-up calls meanwhile)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

import aiohttp

from smetric_router.core.port_file import read_port_file
from tests.helpers.polling import eventually

START_TIMEOUT_S = 60.0


@contextlib.asynccontextmanager
async def router_process(
    args: Sequence[str],
    port_file: Path,
    env: Mapping[str, str] | None = None,
    log: Path | None = None,
) -> AsyncIterator[str]:
    """`python -m smetric_router --port 0 args...` with `env` added to this process's; yields its
    base URL once it reports its port and is ready; stops it (SIGTERM) on the way out. log: where
    its stderr (its log) goes; this process's stderr if None."""
    with contextlib.ExitStack() as files:
        stderr = files.enter_context(log.open("wb")) if log is not None else None
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "smetric_router", "--port", "0", "--port-file", str(port_file),
            *args, env={**os.environ, **(env or {})}, stderr=stderr,
        )  # fmt: skip
    try:

        def ports() -> dict[str, int] | None:
            assert proc.returncode is None, f"the router exited with {proc.returncode}"
            return read_port_file(port_file)

        port = (await eventually(ports, "the router's port", START_TIMEOUT_S))["http"]
        url = f"http://127.0.0.1:{port}"

        async def ready() -> bool:
            async with aiohttp.ClientSession() as s, s.get(url + "/readiness") as r:
                return r.status == 200

        await eventually(ready, "the router ready", START_TIMEOUT_S)
        yield url
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()
