"""Issue 12 item 5 end to end: a router process short of file descriptors (hard limit 256) under a
flood of 600 concurrent clients answers what it cannot forward with 503, and no worker is marked
down for the router's own shortage."""

from __future__ import annotations

import asyncio
import json
import resource
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from tests.e2e.conftest import StackFactory

SOFT, HARD = 128, 256
CLIENTS = 600


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (SOFT, HARD))


async def _ready(url: str, deadline_s: float = 60.0) -> None:
    deadline = time.monotonic() + deadline_s
    async with aiohttp.ClientSession() as s:
        while True:
            try:
                async with s.get(url + "/readiness") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            assert time.monotonic() < deadline, "the router never became ready"
            await asyncio.sleep(0.1)


async def _flood(url: str) -> Counter[str]:
    body = {"text": "hello there", "sampling_params": {"max_new_tokens": 8}}
    outcomes: Counter[str] = Counter()
    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as s:

        async def one() -> None:
            try:
                async with s.post(url + "/generate", json=body) as r:
                    raw = await r.read()
                    if r.status == 200:
                        outcomes["200"] += 1
                    else:
                        code = json.loads(raw)["error"]["code"]
                        outcomes[f"{r.status} {code}"] += 1
            except (aiohttp.ClientError, asyncio.TimeoutError):
                # Not even accepted: the router had no descriptor for the client's socket.
                outcomes["no connection"] += 1

        await asyncio.gather(*(one() for _ in range(CLIENTS)))
    return outcomes


async def test_fd_exhaustion_answers_503_and_leaves_workers_healthy(
    make_stack: StackFactory, tmp_path: Path
) -> None:
    stack = make_stack(workers=2)
    port_file, log_path = tmp_path / "ports.json", tmp_path / "router.log"
    argv = [sys.executable, "-m", "smetric_router", "--worker-urls", *stack.worker_urls,
            "--port", "0", "--port-file", str(port_file), "--log-level", "info",
            "--health-check-interval-secs", "0.5"]  # fmt: skip
    with log_path.open("w") as log:
        proc = subprocess.Popen(argv, preexec_fn=_low_fd_limit, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "no port file"
            await asyncio.sleep(0.05)
        url = f"http://127.0.0.1:{json.loads(port_file.read_text())['http']}"
        await _ready(url)
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        assert f"Max open files            {HARD}                  {HARD}" in limits, limits
        assert f"open-file limit raised from {SOFT} to the hard limit {HARD}" in (
            log_path.read_text()
        )

        outcomes = await _flood(url)
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/workers") as r:
                workers = (await r.json())["workers"]
            # Served normally afterwards, by every worker.
            served = set()
            for i in range(20):
                body = {"text": f"after {i}", "sampling_params": {"max_new_tokens": 4}}
                async with s.post(url + "/generate", json=body) as r:
                    assert r.status == 200, await r.text()
                    served.add(r.headers["x-smetric-worker"])
    finally:
        proc.terminate()
        proc.wait(30)
    log_text = log_path.read_text()
    assert sum(outcomes.values()) == CLIENTS
    assert outcomes["200"] > 0
    # What failed failed as the router's own shortage: 503, never a worker blamed for it.
    assert outcomes["503 router_overloaded"] > 0, outcomes
    assert set(outcomes) <= {"200", "503 router_overloaded", "no connection"}, outcomes
    assert all(w["healthy"] for w in workers), workers
    assert "marked unhealthy" not in log_text and "failed its health check" not in log_text
    assert served == set(stack.worker_urls)


@pytest.fixture(autouse=True)
def _enough_descriptors_here() -> None:
    # The flood's 600 client sockets live in this (the test's) process.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2 * CLIENTS:
        if hard != resource.RLIM_INFINITY and hard < 2 * CLIENTS:
            pytest.skip(f"the test process may open only {hard} files")
        resource.setrlimit(resource.RLIMIT_NOFILE, (2 * CLIENTS, hard))
