"""Start a server process on ports 0 and learn its ports from its --port-file (tests' helper)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from smetric_router.core.port_file import read_port_file
from tests.helpers.polling import eventually_sync

REPORT_TIMEOUT_S = 60.0


@contextmanager
def reported(args: Sequence[str], port_file: Path) -> Iterator[dict[str, int]]:
    """Run `python -m args... --port-file port_file`; yield its ports once it has bound them, and
    stop it on exit."""
    proc = subprocess.Popen([sys.executable, "-m", *args, "--port-file", str(port_file)])

    def ports() -> dict[str, int] | None:
        assert proc.poll() is None, f"{args[0]} exited with {proc.returncode} before reporting"
        return read_port_file(port_file)

    try:
        yield eventually_sync(ports, f"{args[0]}'s ports", REPORT_TIMEOUT_S)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
