"""Mooncake as HiCache's L3 under 2 real SGLang 0.5.23 workers (CPU, tiny random model).

The stack (conftest's `mooncake_stack`, shared with test_l3_events.py): a local `mooncake_master`
(free loopback ports) started first by the launcher, then 2 workers with
`--hicache-storage-backend mooncake`, then the router. What is checked is SGLang's own behaviour: a
prompt's pages are written through to the store under SGLang's keys (seen by a separate pure
Mooncake client), and the same prompt is then served from L3 (`cached_tokens`) by the other worker
and by the first one after its cache was flushed.
"""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest

from smetric_router.launch import Stack
from tests.helpers.polling import eventually_sync
from tests.real_sglang.conftest import PAGE, generate, l3_pages

pytestmark = pytest.mark.sglang

PAGES = 24  # 384 tokens: above HiCache's 256-token prefetch threshold


def test_pages_written_through_to_mooncake_are_served_from_l3(mooncake_stack: Stack) -> None:
    first, other = mooncake_stack.worker_urls
    ids = [1000 + (i * 37) % 5000 for i in range(PAGES * PAGE)] + [7]
    cold = generate(first, ids)
    assert cold["cached_tokens"] == 0, cold

    eventually_sync(
        lambda: l3_pages(mooncake_stack, ids[: PAGES * PAGE]) == [1] * PAGES,
        "the prompt's pages in L3",
        30,
        interval=0.5,
    )

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
