"""Mooncake as HiCache's L3 under 2 real SGLang 0.5.23 workers (CPU, tiny random model).

Its own stack: a local `mooncake_master` (free loopback ports) started first by the launcher, then
2 workers with `--hicache-storage-backend mooncake`, then the router. What is checked is SGLang's
own behaviour: a prompt's pages are written through to the store under SGLang's keys (seen by a
separate pure Mooncake client), and the same prompt is then served from L3 (`cached_tokens`) by the
other worker and by the first one after its cache was flushed.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from smetric_router.launch import MooncakeSpec, Stack
from smetric_router.launch.ports import free_ports
from tests.real_sglang.conftest import MODEL, post_json, sglang_spec
from tests.sglang_env import require_sglang_python, run_sglang_script

pytestmark = pytest.mark.sglang

PAGE = 16
PAGES = 24  # 384 tokens: above HiCache's 256-token prefetch threshold
SCRIPT = Path(__file__).parent / "sglang_scripts" / "l3_keys.py"


@pytest.fixture(scope="module")
def mooncake_stack() -> Iterator[Stack]:
    require_sglang_python()
    rpc, http, metrics = free_ports(3)
    spec = replace(
        sglang_spec(hicache_storage_backend="mooncake"),
        mooncake=MooncakeSpec(rpc_port=rpc, http_metadata_port=http, metrics_port=metrics,
                              global_segment_size=str(256 << 20)),
    )  # fmt: skip
    with Stack(spec) as stack:
        yield stack


def l3_pages(stack: Stack, ids: list[int]) -> list[int]:
    """Per page of `ids`: 1 when both its K and V objects are in the store."""
    m = stack.spec.mooncake
    assert m is not None
    arg = {"master": f"{m.host}:{m.rpc_port}", "page_size": PAGE, "prefix": MODEL,
           "metadata": f"http://{m.host}:{m.http_metadata_port}/metadata",
           "token_ids": ids}  # fmt: skip
    out = run_sglang_script(SCRIPT, json.dumps(arg), timeout=120)
    exist: list[int] = out["exist"]
    return [int(exist[i] == 1 and exist[i + 1] == 1) for i in range(0, len(exist), 2)]


def generate(url: str, ids: list[int]) -> dict[str, Any]:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    meta: dict[str, Any] = post_json(f"{url}/generate", body, timeout=120)["meta_info"]
    return meta


def test_pages_written_through_to_mooncake_are_served_from_l3(mooncake_stack: Stack) -> None:
    first, other = mooncake_stack.worker_urls
    ids = [1000 + (i * 37) % 5000 for i in range(PAGES * PAGE)] + [7]
    cold = generate(first, ids)
    assert cold["cached_tokens"] == 0, cold

    deadline = time.monotonic() + 30
    while (pages := l3_pages(mooncake_stack, ids[: PAGES * PAGE])) != [1] * PAGES:
        assert time.monotonic() < deadline, f"pages in L3: {pages}"
        time.sleep(0.5)

    # the other worker never saw the prompt: its hit can only come from the store
    assert_from_l3(generate(other, ids))
    # the first worker, its device and host tiers flushed: again from the store
    req = urllib.request.Request(f"{first}/flush_cache", b"", method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
    assert_from_l3(generate(first, ids))


def assert_from_l3(meta: dict[str, Any]) -> None:
    """Every full page of the prompt was a hit, and SGLang says the store served it."""
    details = meta["cached_tokens_details"]
    assert meta["cached_tokens"] == PAGES * PAGE, meta
    assert details["storage"] == PAGES * PAGE and details["device"] == 0, meta
    assert details["storage_backend"] == "MooncakeStore", meta
