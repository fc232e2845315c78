"""The router's upstream hardening end to end, emulated workers and the router as processes: a
router short of file descriptors (hard limit 256) under a flood of 600 concurrent clients answers
what it cannot forward with 503 and marks no worker down; a request whose worker died after
accepting it is not sent to another; a hung worker is answered 504 within the first-byte bound."""

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

from smetric_router.launch import ClusterSpec, RouterSpec, Stack, WorkerSpec
from tests.e2e.conftest import ROUTER_ARGS, SPEEDUP, StackFactory
from tests.e2e.raw import fault
from tests.helpers.polling import eventually

SOFT, HARD = 128, 256
CLIENTS = 600


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (SOFT, HARD))


async def _ready(url: str) -> None:
    async with aiohttp.ClientSession() as s:

        async def ready() -> bool:
            try:
                async with s.get(url + "/readiness") as r:
                    return r.status == 200
            except aiohttp.ClientError:
                return False

        await eventually(ready, "the router ready", 60)


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

        def written() -> bool:
            assert proc.poll() is None, log_path.read_text()
            return port_file.exists() and bool(port_file.read_text().strip())

        await eventually(written, "the port file", 60)
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


def _stack(*router_args: str) -> Stack:
    # Health checks far apart: a worker the router marked failed stays so while the test looks.
    args = (*ROUTER_ARGS, "--health-check-interval-secs", "60", *router_args)
    spec = ClusterSpec(
        router=RouterSpec(port=0, extra_args=args),
        workers=WorkerSpec(count=2, speedup=SPEEDUP),
    )
    return Stack(spec)


async def _faults(s: aiohttp.ClientSession, worker: str, **armed: object) -> dict[str, object]:
    if armed:
        await fault(s, worker, **armed)
    async with s.get(worker + "/emulator/faults") as r:
        state: dict[str, object] = await r.json()
    return state


@pytest.mark.parametrize("retry_on_reset", [False, True])
async def test_worker_dying_with_an_accepted_request_is_not_retried(retry_on_reset: bool) -> None:
    flags = ("--retry-on-reset",) if retry_on_reset else ()
    body = {"text": "a request that kills its worker", "sampling_params": {"max_new_tokens": 8}}
    with _stack(*flags) as stack:
        async with aiohttp.ClientSession() as s:
            for w in stack.worker_urls:  # each drops the next request it accepts, unanswered
                await _faults(s, w, die_mid_stream_next=1)
            async with s.post(stack.url + "/generate", json=body) as r:
                status, err = r.status, (await r.json())["error"]
                chosen = r.headers["x-smetric-worker"]
            left = {w: (await _faults(s, w))["die_mid_stream_next"] for w in stack.worker_urls}
            async with s.get(stack.url + "/workers") as r:
                healthy = {w["url"]: w["healthy"] for w in (await r.json())["workers"]}
    assert status == 502 and err["code"] == "worker_reset"
    if retry_on_reset:
        assert set(left.values()) == {0}  # asked to, the router sent it on, and lost that too
    else:
        # Only the first worker ever saw it; the other still waits for a request to drop.
        assert [w for w, n in left.items() if n == 0] == [chosen]
        assert [w for w, ok in healthy.items() if not ok] == [chosen]


async def test_hung_worker_is_answered_504_within_the_first_byte_bound() -> None:
    body = {"text": "hello", "sampling_params": {"max_new_tokens": 8}, "stream": True}
    with _stack("--first-byte-timeout-secs", "1") as stack:
        async with aiohttp.ClientSession() as s:
            for w in stack.worker_urls:  # accept requests and answer nothing
                await _faults(s, w, stall=True)
            started = time.monotonic()
            async with s.post(stack.url + "/generate", json=body) as r:
                status, err = r.status, (await r.json())["error"]
                chosen = r.headers["x-smetric-worker"]
            took = time.monotonic() - started
            async with s.get(stack.url + "/workers") as r:
                healthy = {w["url"]: w["healthy"] for w in (await r.json())["workers"]}
            for w in stack.worker_urls:
                await _faults(s, w, stall=False)
    assert status == 504 and err["code"] == "worker_timeout" and err["type"] == "server_error"
    assert 1 <= took < 10
    assert healthy[chosen] is False
