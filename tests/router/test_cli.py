"""Flags -> RouterConfig, and the real process: start, serve, metrics port, clean SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from smetric_router.core.port_file import read_port_file
from smetric_router.policies import PolicyParams
from smetric_router.router.api_responses import RESPONSE_ID_KEY_ENV
from smetric_router.router.cli import build_parser, config_from_args
from smetric_router.router.config import (
    ADMIN_API_KEY_ENV,
    API_KEY_ENV,
    WORKER_API_KEY_ENV,
    RouterConfig,
)
from tests.helpers.polling import eventually
from tests.router.conftest import MakeWorker


def test_flags_map_to_config() -> None:
    c = config_from_args(
        [
            "--worker-urls", "http://127.0.0.1:1", "http://127.0.0.1:2",
            "--policy", "cache_aware", "--port", "31000", "--overload", "3",
            "--hit-ratio", "0.25", "--bailian-lambda", "0.5", "--cache-threshold", "0.4",
            "--balance-abs-threshold", "8", "--balance-rel-threshold", "2",
            "--page-size", "64", "--max-retries", "1", "--max-body-bytes", "2048",
            "--prometheus-port", "29000", "--request-timeout-secs", "9",
            "--no-inflight-prefixes",
        ]
    )  # fmt: skip
    assert c.inflight_prefixes is False
    assert c.worker_urls == ("http://127.0.0.1:1", "http://127.0.0.1:2")
    assert (c.policy, c.port, c.page_size, c.max_retries) == ("cache_aware", 31000, 64, 1)
    p = c.policy_params
    assert (p.overload, p.hit_ratio, p.bailian_lambda, p.cache_threshold) == (3, 0.25, 0.5, 0.4)
    assert (p.balance_abs_threshold, p.balance_rel_threshold) == (8, 2)
    assert (c.max_body_bytes, c.prometheus_port, c.request_timeout_secs) == (2048, 29000, 9)
    d = config_from_args([])
    assert d.inflight_prefixes is True  # on by default
    assert (d.host, d.port, d.policy, d.page_size, d.prometheus_port) == (
        "127.0.0.1",
        30000,
        "smetric",
        None,
        None,
    )


def test_every_flag_is_explained() -> None:
    for action in build_parser()._actions:
        assert action.help, action.option_strings


@pytest.mark.parametrize(
    "argv",
    [["--page-size", "0"], ["--hit-ratio", "2"], ["--policy", "nope"], ["--max-retries", "-1"]],
)
def test_bad_flags_exit_with_usage_error(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        config_from_args(argv)
    assert e.value.code == 2


# Every flag, given, reaches its field as it did when each flag was written out by hand: the
# parser is generated from RouterConfig's fields now, and this pins what it parses to.
_EVERY_FLAG: list[tuple[list[str], dict[str, Any]]] = [
    ([], {}),
    (["--host", "0.0.0.0", "--port", "0", "--policy", "bailian"],
     {"host": "0.0.0.0", "port": 0, "policy": "bailian"}),
    (["--processes", "3"], {"processes": 3, "reuse_port": True}),
    (["--reuse-port"], {"reuse_port": True}),
    (["--worker-urls", "http://a:1", "http://b:2"], {"worker_urls": ("http://a:1", "http://b:2")}),
    (["--port=5", "--worker-urls"], {"port": 5}),
    (["--prometheus-port", "9", "--prometheus-host", "0.0.0.0", "--log-level", "debug",
      "--request-timeout-secs", "5"],
     {"prometheus_port": 9, "prometheus_host": "0.0.0.0", "log_level": "debug",
      "request_timeout_secs": 5.0}),
    (["--overload", "3", "--move-cost-ratio", "1.5", "--hit-ratio", "0.2",
      "--bailian-lambda", "0.3", "--cache-threshold", "0.1", "--balance-abs-threshold", "7",
      "--balance-rel-threshold", "1.1"],
     {"policy_params": PolicyParams(
         overload=3.0, move_cost_ratio=1.5, hit_ratio=0.2, bailian_lambda=0.3, cache_threshold=0.1,
         balance_abs_threshold=7.0, balance_rel_threshold=1.1)}),
    (["--tokenizer-path", "/x", "--chat-template", "/y.jinja", "--page-size", "32",
      "--load-poll-interval-secs", "1", "--health-check-interval-secs", "2",
      "--health-check-timeout-secs", "3", "--max-body-bytes", "4096", "--max-retries", "0"],
     {"tokenizer_path": "/x", "chat_template": "/y.jinja", "page_size": 32,
      "load_poll_interval_secs": 1.0, "health_check_interval_secs": 2.0,
      "health_check_timeout_secs": 3.0, "max_body_bytes": 4096, "max_retries": 0}),
    (["--no-kv-events", "--trust-kv-endpoints", "--no-inflight-prefixes", "--cache-view", "probe",
      "--probe-timeout-secs", "0.5", "--shutdown-grace-secs", "0"],
     {"kv_events": False, "trust_kv_endpoints": True, "inflight_prefixes": False,
      "cache_view": "probe", "probe_timeout_secs": 0.5, "shutdown_grace_secs": 0.0}),
    (["--l3-view", "master", "--mooncake-master-url", "http://m:1", "--l3-key-prefix", "k",
      "--l3-tp-rank", "2", "--l3-budget-secs", "0.1", "--l3-cache-ttl-secs", "0",
      "--l3-aware-guard"],
     {"l3_view": "master", "mooncake_master_url": "http://m:1", "l3_key_prefix": "k",
      "l3_tp_rank": 2, "l3_budget_secs": 0.1, "l3_cache_ttl_secs": 0.0,
      "policy_params": PolicyParams(l3_aware=True)}),
    (["--max-upstream-connections", "5", "--retry-on-reset", "--first-byte-timeout-secs", "9",
      "--stream-idle-timeout-secs", "8"],
     {"max_upstream_connections": 5, "retry_on_reset": True, "first_byte_timeout_secs": 9.0,
      "stream_idle_timeout_secs": 8.0}),
    (["--api-key", "a", "--admin-api-key", "b", "--worker-api-key", "c",
      "--response-id-key", "x" * 16],
     {"api_key": "a", "admin_api_key": "b", "worker_api_key": "c", "response_id_key": "x" * 16}),
    (["--forward-authorization", "--context-length", "100", "--no-session-hints",
      "--anthropic-thinking", "reject"],
     {"forward_authorization": True, "context_length": 100, "session_hints": False,
      "anthropic_thinking": "reject"}),
    (["--pd-disaggregation", "--prefill", "http://p:1", "--prefill", "http://p:2", "9",
      "--prefill", "http://p:3", "NONE", "--decode", "http://d:1", "--decode", "http://d:2",
      "--prefill-policy", "random", "--decode-policy", "round_robin",
      "--pd-handover-timeout-secs", "6"],
     {"pd_disaggregation": True,
      "prefill": (("http://p:1", None), ("http://p:2", 9), ("http://p:3", None)),
      "decode_urls": ("http://d:1", "http://d:2"), "prefill_policy": "random",
      "decode_policy": "round_robin",
      "pd_handover_timeout_secs": 6.0}),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "fields"), _EVERY_FLAG)
def test_every_flag_parses_to_its_field(
    argv: list[str], fields: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    for env in (API_KEY_ENV, ADMIN_API_KEY_ENV, WORKER_API_KEY_ENV, RESPONSE_ID_KEY_ENV):
        monkeypatch.delenv(env, raising=False)
    assert config_from_args(argv) == RouterConfig(**fields)


def test_keys_fall_back_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_ENV, "env-key")
    monkeypatch.setenv(ADMIN_API_KEY_ENV, "")  # empty = unset
    monkeypatch.setenv(WORKER_API_KEY_ENV, "env-worker")
    monkeypatch.setenv(RESPONSE_ID_KEY_ENV, "r" * 16)
    c = config_from_args(["--api-key", "flag-key"])
    assert (c.api_key, c.admin_api_key, c.worker_api_key, c.response_id_key) == (
        "flag-key", None, "env-worker", "r" * 16
    )  # fmt: skip


async def _wait_ok(s: aiohttp.ClientSession, url: str, proc: asyncio.subprocess.Process) -> None:
    async def ok() -> bool:
        assert proc.returncode is None, "router exited during start-up"
        try:
            async with s.get(url) as resp:
                return resp.status == 200
        except aiohttp.ClientConnectionError:
            return False

    await eventually(ok, f"{url} ready")


async def _reported(path: Path, proc: asyncio.subprocess.Process) -> dict[str, int]:
    def ports() -> dict[str, int] | None:
        assert proc.returncode is None, "router exited during start-up"
        return read_port_file(path)

    return await eventually(ports, "the router's ports")


async def test_process_serves_and_stops_on_sigterm(make_worker: MakeWorker, tmp_path: Path) -> None:
    w = await make_worker("a")
    port_file = tmp_path / "ports.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "smetric_router",
        "--port", "0", "--worker-urls", w.url, "--prometheus-port", "0",
        "--log-level", "warning", "--port-file", str(port_file),
    )  # fmt: skip
    try:
        ports = await _reported(port_file, proc)
        port, prom = ports["http"], ports["prometheus"]
        async with aiohttp.ClientSession() as s:
            await _wait_ok(s, f"http://127.0.0.1:{port}/readiness", proc)
            body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            async with s.post(url, json=body) as resp:
                assert resp.status == 200 and resp.headers["x-smetric-worker"] == w.url
            async with s.get(f"http://127.0.0.1:{prom}/metrics") as resp:
                assert "smetric_decisions_total" in await resp.text()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_process_refuses_workers_that_disagree_on_page_size(
    make_worker: MakeWorker,
) -> None:
    a, b = await make_worker("a", page_size=16), await make_worker("b", page_size=64)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "smetric_router", "--port", "0",
        "--worker-urls", a.url, b.url,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 1
    assert b"disagree on the KV page size" in err


def test_pd_flags_map_to_config() -> None:
    c = config_from_args(
        [
            "--pd-disaggregation",
            "--prefill", "http://p1:30000", "8998",
            "--prefill", "http://p2:30000", "none",
            "--prefill", "http://[fd00::3]:30000",
            "--decode", "http://d1:30000", "--decode", "http://d2:30000",
            "--prefill-policy", "load_balance",
            "--pd-handover-timeout-secs", "30",
        ]
    )  # fmt: skip
    assert c.prefill == (
        ("http://p1:30000", 8998),
        ("http://p2:30000", None),
        ("http://[fd00::3]:30000", None),
    )
    assert c.decode_urls == ("http://d1:30000", "http://d2:30000")
    assert (c.prefill_policy_name, c.decode_policy) == ("load_balance", "least_tokens")
    assert c.pd_handover_timeout_secs == 30
    # Without --prefill-policy the prefill side follows --policy; smetric by default.
    d = config_from_args(
        ["--pd-disaggregation", "--prefill", "http://p:1", "--decode", "http://d:1"]
    )
    assert (d.prefill_policy_name, d.decode_policy) == ("smetric", "least_tokens")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--prefill", "http://p:1", "--decode", "http://d:1"], "need --pd-disaggregation"),
        (["--decode-policy", "round_robin"], "--decode-policy needs --pd-disaggregation"),
        (["--pd-disaggregation", "--decode", "http://d:1"], "at least one --prefill"),
        (["--pd-disaggregation", "--prefill", "http://p:1"], "one --decode"),
        (
            ["--pd-disaggregation", "--prefill", "http://p:1", "--decode", "http://d:1",
             "--worker-urls", "http://w:1"],
            "cannot be mixed",
        ),
        (
            ["--pd-disaggregation", "--prefill", "http://p:1", "port", "--decode", "http://d:1"],
            "must be a number or 'none'",
        ),
        (
            ["--pd-disaggregation", "--prefill", "http://p:1", "70000", "--decode", "http://d:1"],
            "1..65535",
        ),
        (
            ["--pd-disaggregation", "--prefill", "http://p:1", "1", "2", "--decode", "http://d:1"],
            "URL [BOOTSTRAP_PORT|none]",
        ),
        (["--pd-disaggregation", "--prefill", "p:1", "--decode", "http://d:1"], "http://host"),
    ],
)  # fmt: skip
def test_bad_pd_flags_say_what_is_wrong(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        config_from_args(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err
