"""Workers on ports the launcher chose (real SGLang's) are started again on fresh ports when one
dies during start-up: a port chosen free may be taken by another listener before the child binds
it (seen in CI: SGLang's KV-event replay port, `ZMQError: Address already in use`)."""

from __future__ import annotations

import logging
import sys

import pytest

from smetric_router.launch import ClusterSpec, Stack
from smetric_router.launch import stack as stack_mod
from smetric_router.launch.kinds.base import WorkerLaunch
from smetric_router.launch.ports import ephemeral_low, free_port, free_ports

SERVE = (
    "import http.server, sys\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.end_headers(); self.wfile.write(b'ok')\n"
    "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n"
)
DIE = "import sys; sys.exit('OSError: [Errno 98] Address already in use')"


def _planner(scripts: list[str]) -> tuple[list[int], object]:
    """A plan_workers stand-in: one worker per call, on a fresh port, running scripts[call]."""
    ports: list[int] = []

    def plan(_spec: ClusterSpec) -> list[WorkerLaunch]:
        port = free_port()
        script = scripts[min(len(ports), len(scripts) - 1)]
        ports.append(port)
        argv = (sys.executable, "-c", script, str(port))
        return [WorkerLaunch(name="worker-0", url=f"http://127.0.0.1:{port}", argv=argv)]

    return ports, plan


def test_a_worker_dying_at_start_up_is_started_again_on_fresh_ports(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ports, plan = _planner([DIE, SERVE])
    monkeypatch.setattr(stack_mod, "plan_workers", plan)
    caplog.set_level(logging.WARNING, "smetric_router.launch")
    stack = Stack(ClusterSpec())
    try:
        stack.start_workers()
        assert len(ports) == 2 and ports[0] != ports[1]
        assert stack.worker_urls == [f"http://127.0.0.1:{ports[1]}"]
        assert [c.name for c in stack.children] == ["worker-0"]  # the dead one is not kept
        warned = [r.getMessage() for r in caplog.records]
        assert any("worker-0 exited with code 1 during start-up" in m and "attempt 2 of 3" in m
                   for m in warned), warned  # fmt: skip
    finally:
        stack.stop()


def test_a_worker_that_always_dies_fails_after_three_attempts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ports, plan = _planner([DIE])
    monkeypatch.setattr(stack_mod, "plan_workers", plan)
    stack = Stack(ClusterSpec())
    with pytest.raises(stack_mod.ChildExited, match="worker-0 exited with code 1"):
        stack.start_workers()
    stack.stop()
    assert len(ports) == stack_mod.START_ATTEMPTS == 3


def test_free_ports_are_below_the_ephemeral_range_and_distinct() -> None:
    ports = free_ports(50)
    assert len(set(ports)) == 50
    assert all(10_000 <= p < ephemeral_low() for p in ports), ports
