"""A real `mooncake_master` for tests (from the `mooncake` extra in .venv), on free loopback ports,
that can be killed and restarted on the same ports; and a pure store client that writes pages."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from smetric_router.launch.ports import free_ports


def master_binary() -> str:
    """mooncake_master beside this interpreter (the `mooncake` extra); skip when missing,
    fail under SMETRIC_REQUIRE_SGLANG (CI installs it and libibverbs1)."""
    found = Path(sys.executable).parent / "mooncake_master"
    if found.exists():
        return str(found)
    other = shutil.which("mooncake_master")
    if other:
        return other
    why = "mooncake_master not installed (pip install -e '.[mooncake]')"
    if os.environ.get("SMETRIC_REQUIRE_SGLANG"):
        pytest.fail(why)
    pytest.skip(why)


class Master:
    def __init__(self) -> None:
        self.rpc, self.http, self.metrics = free_ports(3)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The HTTP port the router asks (the master's --metrics_port)."""
        return f"http://127.0.0.1:{self.metrics}"

    @property
    def rpc_address(self) -> str:
        return f"127.0.0.1:{self.rpc}"

    @property
    def metadata_url(self) -> str:
        return f"http://127.0.0.1:{self.http}/metadata"

    def start(self, timeout: float = 30.0) -> None:
        argv = [master_binary(), "--rpc_address=127.0.0.1", f"--rpc_port={self.rpc}",
                "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
                f"--http_metadata_server_port={self.http}", "--metrics_host=127.0.0.1",
                f"--metrics_port={self.metrics}"]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mooncake_master exited with {self.proc.returncode}")
            if self.healthy():
                return
            time.sleep(0.05)
        raise TimeoutError("mooncake_master did not answer /health")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def keys(self) -> set[str]:
        """Every key the master holds, from its own API."""
        with urllib.request.urlopen(self.url + "/get_all_keys", timeout=5) as r:
            return {k for k in r.read().decode().split("\n") if k}

    def __enter__(self) -> Master:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.kill()


def store_client(master: Master, segment_bytes: int = 64 << 20) -> Any:
    """A Mooncake store client that also contributes a segment (so it can hold what it puts)."""
    os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", master.metadata_url, segment_bytes, 16 << 20, "tcp", "",
                     master.rpc_address)  # fmt: skip
    assert rc == 0, f"Mooncake setup: {rc}"
    return store
