"""The launcher keeps the stack up: a child that dies (worker or router) is restarted on the same
ports after a backoff, each exit and restart logged; only a signal ends the stack."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from smetric_router.launch import ClusterSpec, Stack
from smetric_router.launch import stack as stack_mod
from smetric_router.launch.stack import RESTART_CAP_S, pin_ports, restart_delay
from tests.helpers.polling import eventually_sync
from tests.launch.test_launcher_process import _alive

MODEL = "qwen3-coder-30b-a3b-emulated"


def test_restart_delay_doubles_up_to_the_cap() -> None:
    assert [restart_delay(n) for n in range(1, 8)] == [0.5, 1, 2, 4, 8, 16, RESTART_CAP_S]
    assert restart_delay(1000) == RESTART_CAP_S  # a child failing for ever: retried at the cap
    assert restart_delay(3, base=1, cap=3) == 3


def test_pin_ports_gives_the_reported_ports_to_their_flags() -> None:
    argv = ["py", "-m", "x", "--port", "0", "--kv-events-port", "0", "--kv-events-replay-port=0",
            "--page-size", "16", "--port-file", "/tmp/p.json"]  # fmt: skip
    ports = {"http": 4001, "kv_events": 4002, "kv_events_replay": 4003, "unknown": 9}
    assert pin_ports(argv, ports) == [
        "py", "-m", "x", "--port", "4001", "--kv-events-port", "4002",
        "--kv-events-replay-port=4003", "--page-size", "16", "--port-file", "/tmp/p.json",
    ]  # fmt: skip


WAIT_S = 30.0  # restarts back off for seconds: room for a few of them


def test_supervise_backs_off_while_a_child_keeps_dying(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stack_mod, "FAILING_AFTER", 3)
    stack = Stack(ClusterSpec())
    child = stack._spawn("flaky", [sys.executable, "-c", "raise SystemExit(3)"], "http://x")
    starts = [child.started_at]
    caplog.set_level(logging.WARNING, "smetric_router.launch")

    def restarted(n: int) -> bool:
        stack.supervise()
        if child.started_at != starts[-1]:
            starts.append(child.started_at)
        return child.restarts >= n

    # each check runs the supervisor: every 50 ms at the most, as its loop would
    eventually_sync(lambda: restarted(3), "three restarts", WAIT_S, interval=0.05)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # 0.5, 1 and 2 s after each quick death (plus the child's own short life)
    for gap, delay in zip(gaps, [0.5, 1.0, 2.0], strict=True):
        assert delay <= gap < delay + 1.5, gaps
    exits = [r.getMessage() for r in caplog.records if "exited with code 3" in r.getMessage()]
    assert len(exits) == 3 and "restarting it in 2.0 s" in exits[2]
    assert any("flaky keeps failing: 3 exits in a row" in r.getMessage() for r in caplog.records)

    # a run longer than STABLE_S starts a new streak: the next restart comes after the base delay
    eventually_sync(
        lambda: child.proc is not None and child.proc.poll() is not None, "the 4th exit", WAIT_S
    )
    child.started_at -= stack_mod.STABLE_S
    stack.supervise()
    assert child.quick_deaths == 1 and child.restart_at is not None
    assert child.restart_at - time.monotonic() <= 0.5
    stack.stop()


def _children(pid: int) -> dict[int, str]:
    """The launcher's children: pid -> command line."""
    out = {}
    listed = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    for p in listed.stdout.split():
        with contextlib.suppress(FileNotFoundError):
            out[int(p)] = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return out


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def _chat(url: str) -> int:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    req = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code


def _workers(url: str) -> list[dict[str, object]]:
    with urllib.request.urlopen(f"{url}/workers", timeout=5) as r:
        workers: list[dict[str, object]] = json.load(r)["workers"]
    return workers


def test_launcher_restarts_a_killed_worker_and_router_on_their_ports(tmp_path: Path) -> None:
    log_path = tmp_path / "launch.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "smetric_router.launch", "--port", "0", "--workers", "2",
             "--speedup", "20", "--log-level", "warning"],
            stdout=subprocess.PIPE, stderr=log_file, text=True,
        )  # fmt: skip
    seen: set[int] = set()
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"ready at (http://127\.0\.0\.1:\d+) \(.*: (.*)\)", line)
        assert found, line
        url, worker_urls = found[1], found[2].split()
        children = _children(proc.pid)
        seen |= set(children)
        workers = [p for p, cmd in children.items() if "smetric_router.emulator" in cmd]
        (router,) = [p for p, cmd in children.items() if "-m smetric_router --host" in cmd]
        assert len(workers) == 2

        # kill -9 a worker: it comes back on its port, and the router serves with both again
        victim = workers[0]
        subprocess.run(["kill", "-9", str(victim)], check=True)
        log = log_path.read_text

        eventually_sync(
            lambda: re.search(rf"\(pid {victim}\) exited with code -9", log()),
            "the exit log",
            WAIT_S,
        )
        eventually_sync(lambda: "restarted worker-" in log(), "the restart log", WAIT_S)
        restarted = re.search(r"restarted (worker-\d) \(restart 1, pid (\d+)\): .* --port (\d+) ",
                              log())  # fmt: skip
        assert restarted, log()
        assert f"http://127.0.0.1:{restarted[3]}" in worker_urls  # the same port
        assert int(restarted[2]) != victim and proc.poll() is None
        seen.add(int(restarted[2]))
        eventually_sync(
            lambda: f"{restarted[1]} is back" in log(), "the worker ready again", WAIT_S
        )
        eventually_sync(
            lambda: all(w["healthy"] for w in _workers(url)) and len(_workers(url)) == 2,
            "the router to see both workers healthy",
            WAIT_S,
        )
        assert all(_chat(url) == 200 for _ in range(4))

        # kill -9 the router: it comes back on the same port
        subprocess.run(["kill", "-9", str(router)], check=True)
        eventually_sync(
            lambda: re.search(rf"router \(pid {router}\) exited with code -9", log()),
            "exit",
            WAIT_S,
        )
        eventually_sync(lambda: "router is back" in log(), "the router ready again", 60)
        assert _get(f"{url}/readiness") == 200
        assert _chat(url) == 200
        assert proc.poll() is None  # the launcher itself never stopped
        seen |= set(_children(proc.pid))

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert not [p for p in seen if _alive(p)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
