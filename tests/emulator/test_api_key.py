"""--api-key as SGLang 0.5.23 has it (srt/utils/auth.py): probes and metrics open, the rest 401."""

from __future__ import annotations

import json
from typing import Any

import pytest

from smetric_router.emulator.__main__ import config_from_args, parse_args
from tests.emulator.conftest import MODEL, make_config, serving
from tests.sglang_env import RESULT_PREFIX, run_sglang

KEY = "worker-key"
CHAT = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


async def test_api_key_guards_all_but_probes_and_metrics() -> None:
    async with serving(make_config(api_key=KEY)) as w:
        for path in ("/health", "/health_generate", "/ready", "/metrics"):
            async with w.http.get(w.url + path) as r:
                assert r.status == 200, path
        guarded = [("GET", "/server_info", None), ("GET", "/v1/models", None),
                   ("GET", "/v1/loads", None), ("POST", "/flush_cache", None),
                   ("POST", "/v1/chat/completions", CHAT)]  # fmt: skip
        for method, path, body in guarded:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
                async with w.http.request(method, w.url + path, json=body, headers=headers) as r:
                    assert r.status == 401, path
                    assert await r.json() == {"error": "Unauthorized"}  # SGLang's body
            good = {"Authorization": f"Bearer {KEY}"}
            async with w.http.request(method, w.url + path, json=body, headers=good) as r:
                assert r.status == 200, path
                if path == "/v1/chat/completions":
                    assert (await r.json())["model"] == "default"  # any name, echoed


async def test_without_a_key_everything_is_open_and_any_model_name_served() -> None:
    async with serving(make_config()) as w:
        async with w.http.post(w.url + "/v1/chat/completions", json=CHAT) as r:
            assert r.status == 200 and (await r.json())["model"] == "default"
        async with w.http.get(w.url + "/v1/models") as r:
            assert [m["id"] for m in (await r.json())["data"]] == [MODEL]


def test_api_key_flag() -> None:
    config = config_from_args(parse_args(["--api-key", KEY]))
    assert config.api_key == KEY and KEY not in repr(config)


# SGLang's own decision function (pure, importable without a server) on the same requests
_DECIDE = """
import json, sys
from sglang.srt.utils.auth import AuthLevel, decide_request_auth
key, cases = sys.argv[1], json.loads(sys.argv[2])
out = [decide_request_auth(method=m, path=p, authorization_header=a, api_key=key,
                           admin_api_key=None, auth_level=AuthLevel(level))
       for m, p, a, level in cases]
print("RESULT " + json.dumps([None if d.allowed else d.error_status_code for d in out]))
"""


_ENDPOINTS = [
    ("GET", "/health"), ("GET", "/health_generate"), ("GET", "/ready"), ("GET", "/metrics"),
    ("GET", "/server_info"), ("GET", "/get_server_info"), ("GET", "/model_info"),
    ("GET", "/v1/models"), ("GET", "/v1/loads"), ("POST", "/flush_cache"), ("POST", "/generate"),
    ("POST", "/v1/completions"), ("GET", "/no/such/path"),
]  # fmt: skip


@pytest.mark.sglang
async def test_api_key_decisions_match_sglangs() -> None:
    cases = [
        (method, path, auth, "admin_optional" if path == "/flush_cache" else "normal")
        for method, path in _ENDPOINTS
        for auth in (None, f"Bearer {KEY}", f"bearer {KEY}", "Bearer other", KEY)
    ]
    proc = run_sglang(["-c", _DECIDE, KEY, json.dumps(cases)], timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    assert proc.returncode == 0 and lines, proc.stdout + proc.stderr
    sglang = json.loads(lines[-1][len(RESULT_PREFIX) :])
    async with serving(make_config(api_key=KEY)) as w:
        ours = []
        for method, path, auth, _ in cases:
            headers = {} if auth is None else {"Authorization": auth}
            body: dict[str, Any] = {"text": "x", "sampling_params": {"max_new_tokens": 1}}
            if path == "/v1/completions":
                body = {"prompt": "x", "max_tokens": 1}
            async with w.http.request(method, w.url + path, json=body, headers=headers) as r:
                ours.append(401 if r.status == 401 else None)
    assert ours == sglang, [c[:3] for c, a, b in zip(cases, ours, sglang, strict=True) if a != b]
