"""`--processes N`: N independent replicas of the router on one port (SO_REUSEPORT). Connections
spread over them, and because each replica builds the same view from the workers (KV events,
loads), decisions stay what one router would make: follow-ups stay sticky whichever replica
answers. Stopping the launcher's router stops every replica."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import pytest

from smetric_router.launch import ClusterSpec, RouterSpec, Stack, WorkerSpec
from smetric_router.loadgen.sessions import run_sessions
from smetric_router.router.serve import replica_argv
from tests.e2e.conftest import ROUTER_ARGS, SPEEDUP
from tests.helpers.polling import eventually_sync
from tests.launch.test_launcher_process import _alive


def test_replica_command_line_keeps_the_flags_but_the_first_process_own() -> None:
    argv = ["--processes", "3", "--port=0", "--port-file", "/tmp/p", "--policy", "smetric",
            "--prometheus-port", "9", "--worker-urls", "http://a:1", "http://b:1"]  # fmt: skip
    out = replica_argv(argv, 4321)
    assert out[1:3] == ["-m", "smetric_router"]
    assert out[3:] == ["--policy", "smetric", "--worker-urls", "http://a:1", "http://b:1",
                       "--port", "4321", "--reuse-port"]  # fmt: skip


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    spec = ClusterSpec(
        router=RouterSpec(port=0, extra_args=(*ROUTER_ARGS, "--processes", "2")),
        workers=WorkerSpec(count=3, speedup=SPEEDUP),
    )
    with Stack(spec) as s:
        yield s


def pids(stack: Stack, n: int = 40) -> set[int]:
    seen = set()
    for _ in range(n):
        with urllib.request.urlopen(stack.url + "/health") as r:  # a new connection each time
            seen.add(json.load(r)["pid"])
    return seen


def ready_everywhere(stack: Stack, timeout: float = 60) -> set[int]:
    """Both replicas answering, each with every worker healthy."""

    def both() -> set[int]:
        with urllib.request.urlopen(stack.url + "/readiness") as r:
            ok = json.load(r)["healthy_workers"] == 3
        seen = pids(stack)
        return seen if ok and len(seen) == 2 else set()

    return eventually_sync(both, "both replicas ready with every worker healthy", timeout)


def test_replicas_accept_each_others_response_ids(stack: Stack) -> None:
    """Without --response-id-key each router has a random key: its replicas get the same one,
    so a Responses chain continues whichever replica each request reaches. (Runs before the
    test that stops the stack.)"""
    ready_everywhere(stack)
    previous: str | None = None
    for turn in range(12):  # a new connection each time: both replicas take part
        body: dict[str, object] = {"model": "m", "input": f"step {turn}", "max_output_tokens": 4}
        if previous is not None:
            body["previous_response_id"] = previous
        req = urllib.request.Request(
            stack.url + "/v1/responses",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200
            reason = r.headers["x-smetric-reason"]
            previous = json.load(r)["id"]
        assert reason == ("first-turn-balance" if turn == 0 else "response-holder"), turn


async def test_replicas_share_the_port_and_keep_sessions_sticky(stack: Stack) -> None:
    seen = ready_everywhere(stack)
    # 8 sessions at once: their connections land on both replicas; a follow-up may reach another
    # replica than its previous turn, which holds the same view (as in test_sessions.py, a reply's
    # KV events can trail the next turn by a moment: 90 %).
    report = await run_sessions(stack.url, sessions=8, turns=4)
    pairs = report.followups()
    sticky_same = [f for p, f in pairs if f.reason == "sticky" and f.worker == p.worker]
    assert len(sticky_same) >= 0.9 * len(pairs), report.summary()
    stack.stop()
    eventually_sync(lambda: not any(_alive(p) for p in seen), "every replica gone", 30)
