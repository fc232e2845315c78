"""Emulated workers and routers as separate processes that a test starts, stops and restarts one
by one (the launcher's Stack starts a whole cluster at once), with KV events configured per
worker through SGLang's --kv-events-config."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from smetric_router.core.port_file import read_port_file
from smetric_router.launch.ports import free_ports
from tests.helpers.polling import eventually

START_TIMEOUT_S = 60.0


@dataclass
class Proc:
    url: str
    proc: subprocess.Popen[bytes]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def _started(argv: list[str], ready_path: str) -> Proc:
    port_file = Path(tempfile.mkdtemp(prefix="smetric-kvstack-")) / "ports.json"
    proc = subprocess.Popen([*argv, "--port-file", str(port_file)])

    def reported() -> dict[str, int] | None:
        assert proc.poll() is None, f"{argv[2]} exited with {proc.returncode}"
        return read_port_file(port_file)

    ports = await eventually(reported, f"{argv[2]}'s ports", START_TIMEOUT_S)
    shutil.rmtree(port_file.parent, ignore_errors=True)
    url = f"http://127.0.0.1:{ports['http']}"
    async with aiohttp.ClientSession() as http:

        async def ready() -> bool:
            assert proc.poll() is None, f"{argv[2]} exited with {proc.returncode}"
            try:
                async with http.get(url + ready_path) as r:
                    return r.status == 200
            except aiohttp.ClientError:
                return False

        await eventually(ready, f"{url}{ready_path} ready", START_TIMEOUT_S)
    return Proc(url, proc)


async def start_worker(
    *, buffer_steps: int = 10000, speedup: float = 20.0, kv_host: str = "127.0.0.1"
) -> Proc:
    pub, replay = free_ports(2)
    kv = {
        "publisher": "zmq",
        "endpoint": f"tcp://{kv_host}:{pub}",
        "replay_endpoint": f"tcp://{kv_host}:{replay}",
        "bind": True,
        "buffer_steps": buffer_steps,
    }
    argv = [sys.executable, "-m", "smetric_router.emulator", "--host", "127.0.0.1", "--port",
            "0", "--page-size", "16", "--speedup", str(speedup),
            "--kv-events-config", json.dumps(kv)]  # fmt: skip
    return await _started(argv, "/health")


async def start_router(workers: list[str], *extra: str) -> Proc:
    argv = [sys.executable, "-m", "smetric_router", "--host", "127.0.0.1", "--port", "0",
            "--policy", "smetric", "--load-poll-interval-secs", "0.1", "--log-level", "warning",
            "--worker-urls", *workers, *extra]  # fmt: skip
    return await _started(argv, "/readiness")


async def worker_probe(http: aiohttp.ClientSession, worker: str, ids: list[int]) -> int:
    """The worker's own GPU-tier prefix of `ids` (the patched SGLang's probe)."""
    async with http.post(f"{worker}/smetric/prefix_match", json={"input_ids": ids}) as r:
        assert r.status == 200, await r.text()
        return int((await r.json())["results"][0]["device"])
