"""Start a server process on ports 0 and learn its ports from its --port-file (tests' helper)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from smetric_router.core.port_file import read_port_file

REPORT_TIMEOUT_S = 60.0


@contextmanager
def reported(args: Sequence[str], port_file: Path) -> Iterator[dict[str, int]]:
    """Run `python -m args... --port-file port_file`; yield its ports once it has bound them, and
    stop it on exit."""
    proc = subprocess.Popen([sys.executable, "-m", *args, "--port-file", str(port_file)])
    try:
        deadline = time.monotonic() + REPORT_TIMEOUT_S
        while (ports := read_port_file(port_file)) is None:
            assert proc.poll() is None, f"{args[0]} exited with {proc.returncode} before reporting"
            assert time.monotonic() < deadline, f"{args[0]} reported no ports"
            time.sleep(0.05)
        yield ports
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
