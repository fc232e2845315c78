"""Tenants through a launched stack: a router with --api-key-file (one tenant at one request a
minute, one unlimited) and the admission queue on, in front of 2 emulated workers. The limited
tenant's second request is answered 429 with Retry-After in each API's shape, the other tenant
is served throughout, and SGLang's `priority` passes to the workers (which take it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from smetric_router.launch import ClusterSpec, RouterSpec, Stack, WorkerSpec
from tests.e2e.conftest import ROUTER_ARGS, SPEEDUP
from tests.helpers.prometheus import total

SLOW, FAST = "sk-e2e-slow", "sk-e2e-fast"
MODEL = WorkerSpec().model_name
KEYS = f"""
tenants:
  - {{name: slow, key: {SLOW}, requests_per_minute: 1}}
  - {{name: fast, key: {FAST}, weight: 2, max_priority: 10}}
"""
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": MODEL, "max_tokens": 4,
                             "messages": [{"role": "user", "content": "tenants"}]},
    "/v1/messages": {"model": MODEL, "max_tokens": 4,
                     "messages": [{"role": "user", "content": "tenants"}]},
    "/v1/responses": {"model": MODEL, "input": "tenants", "max_output_tokens": 4,
                      "store": False},
}  # fmt: skip


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    keys: Path = tmp_path_factory.mktemp("tenants") / "keys.yaml"
    keys.write_text(KEYS)
    args = (*ROUTER_ARGS, "--api-key-file", str(keys), "--max-concurrent-requests", "8")
    spec = ClusterSpec(
        router=RouterSpec(port=0, extra_args=args),
        workers=WorkerSpec(count=2, speedup=SPEEDUP),
    )
    with Stack(spec) as s:
        yield s


def headers(key: str, path: str) -> dict[str, str]:
    return {"x-api-key": key} if path == "/v1/messages" else {"Authorization": f"Bearer {key}"}


async def post(
    http: aiohttp.ClientSession, stack: Stack, path: str, key: str, **extra: Any
) -> tuple[int, dict[str, str], Any]:
    body = {**BODIES[path], **extra}
    async with http.post(stack.url + path, json=body, headers=headers(key, path)) as r:
        return r.status, dict(r.headers), await r.json()


async def test_a_tenant_over_its_rate_gets_429_and_another_is_served(stack: Stack) -> None:
    async with aiohttp.ClientSession() as http:
        status, hdrs, _ = await post(http, stack, "/v1/chat/completions", SLOW)
        assert status == 200 and hdrs["x-smetric-tenant"] == "slow"
        for path in BODIES:
            status, hdrs, body = await post(http, stack, path, SLOW)
            assert status == 429, (path, body)
            assert 1 <= int(hdrs["Retry-After"]) <= 60
            assert hdrs["x-smetric-shed"] == "rate_limit"
            if path == "/v1/messages":
                assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
            else:
                assert body["error"]["code"] == "rate_limit_exceeded"
            # the other tenant meanwhile
            status, hdrs, body = await post(http, stack, path, FAST)
            assert status == 200, (path, body)
            assert hdrs["x-smetric-tenant"] == "fast"
        async with http.get(stack.url + "/metrics") as r:
            text = await r.text()
    assert total(text, "smetric_admission_shed_total", reason="rate_limit", tenant="slow") == 3
    assert total(text, "smetric_admission_shed_total", tenant="fast") == 0
    assert total(text, "smetric_admission_admitted_total", tenant="fast") >= 3


async def test_priority_passes_to_the_workers_within_the_cap(stack: Stack) -> None:
    async with aiohttp.ClientSession() as http:
        status, _, body = await post(http, stack, "/v1/chat/completions", FAST, priority=10)
        assert status == 200, body
        status, _, body = await post(http, stack, "/v1/chat/completions", FAST, priority=11)
        assert status == 400 and body["error"]["param"] == "priority"
        status, _, _ = await post(http, stack, "/v1/chat/completions", "sk-unknown")
        assert status == 401
