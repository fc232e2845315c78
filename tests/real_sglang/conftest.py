"""Real SGLang 0.5.23 workers on CPU (the `sglang` worker kind) behind the router.

These tests start genuine `sglang.launch_server` processes from .venv-sglang (`make sglang`)
through the launcher, so they are marked `sglang`: `pytest -m 'not sglang'` skips them locally.
Without .venv-sglang they skip, unless SMETRIC_REQUIRE_SGLANG=1 (what `make test` sets), where
a missing environment is a failure, not a skip.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from smetric_router.launch import (
    ClusterSpec,
    MooncakeSpec,
    RouterSpec,
    SglangSpec,
    Stack,
    WorkerSpec,
)
from smetric_router.launch.kinds.sglang import TINY_MODEL_NAME
from smetric_router.launch.ports import free_ports
from tests.helpers.groups import SHARED_STACK_FIXTURES
from tests.sglang_env import require_sglang_python, run_sglang_script

pytestmark = pytest.mark.sglang

MODEL = TINY_MODEL_NAME
# SGLang's /health runs a one-token generate behind the queue and gives up after its own 20 s;
# a CPU worker with a full batch takes longer than the router's default 5 s to answer it, and
# one missed check excludes the worker (its follow-ups then fall back as evicted)
ROUTER_ARGS = ("--load-poll-interval-secs", "0.2", "--log-level", "warning",
               "--health-check-timeout-secs", "30")  # fmt: skip
# small enough that a few long prompts push pages from the device tier to the host tier
MAX_TOTAL_TOKENS = 6144


def require_sglang_env() -> None:
    require_sglang_python()


def sglang_spec(
    workers: int = 2, policy: str = "smetric", router_args: tuple[str, ...] = ROUTER_ARGS,
    **sglang: Any,
) -> ClusterSpec:  # fmt: skip
    return ClusterSpec(
        router=RouterSpec(port=0, policy=policy, extra_args=router_args),
        workers=WorkerSpec(kind="sglang", count=workers, page_size=16),
        sglang=SglangSpec(max_total_tokens=MAX_TOTAL_TOKENS, **sglang),
    )


class SharedStack:
    """One real-SGLang stack shared by the tests that ask for it, whatever their module: started by
    the first (~30 s), stopped before a module that does not use it and after the package. So a
    run never holds two real stacks at once (a 2-worker stack takes ~6.5 GB), and a start that
    failed fails its users at once. Their users run one after another (tests/helpers/groups.py)."""

    def __init__(self, spec: Callable[[], ClusterSpec]) -> None:
        self._spec = spec
        self._stack: Stack | None = None
        self._error: str | None = None

    def get(self) -> Stack:
        require_sglang_python()
        if self._error is not None:
            pytest.fail(f"the shared stack did not start: {self._error}")
        if self._stack is None:
            try:
                self._stack = Stack(self._spec()).__enter__()
            except Exception as exc:
                self._error = repr(exc)
                raise
        return self._stack

    def stop(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.stop()


def _mooncake_spec() -> ClusterSpec:
    """A local mooncake_master (free loopback ports) started first by the launcher, then 2 workers
    with `--hicache-storage-backend mooncake`, then the router."""
    rpc, http, metrics = free_ports(3)
    # What the router reports of the tier is checked here, not its patience: with real SGLang
    # CPU workers on 2 cores a master lookup can outlast the 25 ms default, and the header then
    # says unknown (seen once, the turn after a master restart, in a fresh-clone run).
    router_args = (*ROUTER_ARGS, "--l3-budget-secs", "2")
    return replace(
        sglang_spec(hicache_storage_backend="mooncake", router_args=router_args),
        mooncake=MooncakeSpec(rpc_port=rpc, http_metadata_port=http, metrics_port=metrics,
                              global_segment_size=str(256 << 20)),
    )  # fmt: skip


# fixture name -> its stack
SHARED_STACKS = {
    "sglang_stack": SharedStack(sglang_spec),
    "mooncake_stack": SharedStack(_mooncake_spec),
}
assert set(SHARED_STACKS) == set(SHARED_STACK_FIXTURES)


@pytest.fixture
def sglang_stack() -> Stack:
    """2 real SGLang workers + the SMetric router."""
    return SHARED_STACKS["sglang_stack"].get()


@pytest.fixture
def mooncake_stack() -> Stack:
    """2 real SGLang workers on a real Mooncake master as their L3 + the SMetric router."""
    return SHARED_STACKS["mooncake_stack"].get()


@pytest.fixture(scope="module", autouse=True)
def _shared_stacks_only_while_used(request: pytest.FixtureRequest) -> None:
    mine = [i for i in request.session.items if getattr(i, "module", None) is request.module]
    used = {name for i in mine for name in getattr(i, "fixturenames", ())}
    for name, shared in SHARED_STACKS.items():
        if name not in used:
            shared.stop()


@pytest.fixture(scope="package", autouse=True)
def _shared_stacks_stopped_after_the_package() -> Iterator[None]:
    yield
    for shared in SHARED_STACKS.values():
        shared.stop()


def get_json(url: str, timeout: float = 30) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.load(r)


def is_ready(url: str) -> bool:
    """The router at `url` answers /readiness 200 (503 while it has no worker or warms its KV
    views, or no answer yet: not ready)."""
    try:
        return bool(get_json(url + "/readiness", timeout=2)["status"] == "ready")
    except (urllib.error.URLError, OSError):
        return False


def post_json(url: str, body: Any, timeout: float = 60) -> Any:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def flush(stack: Stack) -> None:
    """Empty every worker's cache (SGLang emits AllBlocksCleared), so each test starts cold.
    SGLang refuses to flush a busy worker (400); `timeout` makes it wait for the previous test's
    last request to finish first."""
    out = post_json(stack.url + "/flush_cache?timeout=60", {}, timeout=90)
    assert all(r["status"] == 200 for r in out["results"].values()), out


# --- Mooncake as L3 ------------------------------------------------------------------------------

PAGE = 16
L3_KEYS_SCRIPT = Path(__file__).parent / "sglang_scripts" / "l3_keys.py"


def l3_pages(stack: Stack, ids: list[int]) -> list[int]:
    """Per full page of `ids`: 1 when both its K and V objects are in the store (asked by a
    separate pure Mooncake client, sglang_scripts/l3_keys.py)."""
    m = stack.spec.mooncake
    assert m is not None
    arg = {"master": f"{m.host}:{m.rpc_port}", "page_size": PAGE, "prefix": MODEL,
           "metadata": f"http://{m.host}:{m.http_metadata_port}/metadata",
           "token_ids": ids}  # fmt: skip
    out = run_sglang_script(L3_KEYS_SCRIPT, json.dumps(arg), timeout=120)
    exist: list[int] = out["exist"]
    return [int(exist[i] == 1 and exist[i + 1] == 1) for i in range(0, len(exist), 2)]


def generate(url: str, ids: list[int]) -> dict[str, Any]:
    """One /generate of token ids (1 new token, greedy); its meta_info."""
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    meta: dict[str, Any] = post_json(f"{url}/generate", body, timeout=120)["meta_info"]
    return meta
