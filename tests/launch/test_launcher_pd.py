"""The launcher's PD workers as processes: a launched prefill and decode pair serves a request."""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from smetric_router.launch import ClusterSpec, PdSpec, Stack, WorkerSpec


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        out: dict[str, Any] = json.load(r)
        return out


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as r:
        out: dict[str, Any] = json.load(r)
        return out


def test_launched_prefill_and_decode_serve_a_pair() -> None:
    spec = ClusterSpec(workers=WorkerSpec(speedup=20.0), pd=PdSpec(prefill=1, decode=1))
    stack = Stack(spec)
    try:
        stack.start_workers()
        prefill, decode = stack.workers
        assert _get(prefill.url + "/server_info")["disaggregation_mode"] == "prefill"
        info = _get(decode.url + "/server_info")
        assert info["disaggregation_mode"] == "decode" and info["kv_events"] is None
        body = {
            "messages": [{"role": "user", "content": "hello through a launched pair"}],
            "max_tokens": 6,
            "ignore_eos": True,
            "bootstrap_host": "127.0.0.1",
            "bootstrap_port": prefill.bootstrap_port,
            "bootstrap_room": 12345,
        }
        with ThreadPoolExecutor(2) as pool:
            p, d = pool.map(
                lambda url: _post(url + "/v1/chat/completions", body), [prefill.url, decode.url]
            )
        assert p["usage"]["completion_tokens"] == 1
        assert d["usage"]["completion_tokens"] == 6 and d["choices"][0]["finish_reason"] == "stop"
    finally:
        stack.stop()
    assert all(c.proc is not None and c.proc.poll() is not None for c in stack.children)
