"""Flags -> RouterConfig, and the real process: start, serve, metrics port, clean SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from smetric_router.core.port_file import read_port_file
from smetric_router.router.cli import build_parser, config_from_args
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
            "--prefill-policy", "load_balance", "--prefill-overload-slack", "1000",
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
    assert c.prefill_params().overload_slack == 1000 and c.pd_handover_timeout_secs == 30
    # Without --prefill-policy the prefill side follows --policy; smetric by default.
    d = config_from_args(
        ["--pd-disaggregation", "--prefill", "http://p:1", "--decode", "http://d:1"]
    )
    assert (d.prefill_policy_name, d.decode_policy) == ("smetric", "least_tokens")
    assert d.prefill_params().overload_slack == 4096  # tokens, not requests


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
