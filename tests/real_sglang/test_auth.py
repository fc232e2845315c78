"""--worker-api-key against a real SGLang 0.5.23 worker started with --api-key: the router reads
its /server_info (page size, KV events), forwards generation and flushes with the worker's key,
and a client's own Authorization never reaches it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from smetric_router.launch import Stack
from tests.real_sglang.conftest import MODEL, sglang_spec
from tests.sglang_env import require_sglang_python

pytestmark = pytest.mark.sglang

KEY, WORKER_KEY = "router-key", "sglang-worker-key"


def _call(url: str, body: Any = None, key: str | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, headers, method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


@pytest.fixture(scope="module")
def keyed_stack() -> Iterator[Stack]:
    require_sglang_python()
    spec = sglang_spec(workers=1)
    spec = replace(
        spec,
        router=replace(
            spec.router,
            extra_args=(*spec.router.extra_args, "--api-key", KEY, "--worker-api-key", WORKER_KEY),
        ),
        workers=replace(spec.workers, extra_args=("--api-key", WORKER_KEY)),
    )
    with Stack(spec) as stack:
        yield stack


def test_router_uses_the_worker_key_with_real_sglang(keyed_stack: Stack) -> None:
    worker, router = keyed_stack.worker_urls[0], keyed_stack.url
    assert _call(worker + "/server_info")[0] == 401  # SGLang really wants the key
    status, listed = _call(router + "/workers", key=KEY)
    assert status == 200
    (w,) = listed["workers"]
    assert w["healthy"] and w["problem"] is None and w["page_size"] == 16
    assert MODEL in w["models"]
    chat = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    assert _call(router + "/v1/chat/completions", chat)[0] == 401
    status, reply = _call(router + "/v1/chat/completions", chat, key=KEY)
    assert status == 200, reply
    assert reply["choices"][0]["message"]["content"] is not None
    status, flushed = _call(router + "/flush_cache?timeout=60", {}, key=KEY)
    assert status == 200, flushed
    assert flushed["results"][worker]["status"] == 200
