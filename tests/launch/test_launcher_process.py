"""The launcher as a user runs it: ready line, serving, and SIGTERM stops every child."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_launcher_serves_then_stops_everything_on_sigterm() -> None:
    # --port 0: the router binds a free port and the ready line names it
    proc = subprocess.Popen(
        [sys.executable, "-m", "smetric_router.launch", "--port", "0", "--workers", "2",
         "--log-level", "warning"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the stack is ready (or the launcher exits)
        found = re.search(r"ready at http://127\.0\.0\.1:(\d+) ", line)
        assert found and int(found[1]) > 0, line
        url = f"http://127.0.0.1:{found[1]}"
        with urllib.request.urlopen(f"{url}/workers", timeout=5) as r:
            workers = json.load(r)["workers"]
        assert len(workers) == 2 and all(w["healthy"] for w in workers)
        # the workers bound free ports too, and the router was given the ones they bound
        ports = {int(w["url"].rsplit(":", 1)[1]) for w in workers}
        assert len(ports) == 2 and 0 not in ports
        assert all(w["kv_pages"] == {"gpu": 0, "host": 0} for w in workers)
        children = subprocess.run(
            ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True, check=False
        ).stdout.split()
        assert len(children) == 3  # two workers and the router

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert not [pid for pid in children if _alive(int(pid))]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_busy_port_is_a_clear_error() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "smetric_router.launch", "--port", str(port), "--workers", "1"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert done.returncode == 1
    assert f"router port 127.0.0.1:{port} is already in use" in done.stderr
