"""Real SGLang 0.5.23 workers on CPU (the `sglang` worker kind) behind the router.

These tests start genuine `sglang.launch_server` processes from .venv-sglang (`make sglang`)
through the launcher, so they are marked `sglang`: `pytest -m 'not sglang'` skips them locally.
Without .venv-sglang they skip, unless SMETRIC_REQUIRE_SGLANG=1 (what `make test` sets), where
a missing environment is a failure, not a skip.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from smetric_router.launch import ClusterSpec, RouterSpec, SglangSpec, Stack, WorkerSpec
from smetric_router.launch.kinds.sglang import TINY_MODEL_NAME
from tests.sglang_env import require_sglang_python

pytestmark = pytest.mark.sglang

MODEL = TINY_MODEL_NAME
ROUTER_ARGS = ("--load-poll-interval-secs", "0.2", "--log-level", "warning")
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


@pytest.fixture(scope="package")
def sglang_stack() -> Iterator[Stack]:
    """2 real SGLang workers + the SMetric router, shared by the package's tests (start: ~1 min)."""
    require_sglang_python()
    with Stack(sglang_spec()) as stack:
        yield stack


def get_json(url: str, timeout: float = 30) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.load(r)


def post_json(url: str, body: Any, timeout: float = 60) -> Any:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def flush(stack: Stack) -> None:
    """Empty every worker's cache (SGLang emits AllBlocksCleared), so each test starts cold."""
    out = post_json(stack.url + "/flush_cache", {})
    assert all(r["status"] == 200 for r in out["results"].values()), out
