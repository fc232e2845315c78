"""--api-key as SGLang 0.5.23 has it (srt/utils/auth.py): probes and metrics open, the rest 401."""

from __future__ import annotations

from smetric_router.emulator.__main__ import config_from_args, parse_args
from tests.emulator.conftest import MODEL, make_config, serving

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
