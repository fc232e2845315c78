"""Ports 0: the emulated worker and the router bind free ports themselves and report them through
--port-file; the launcher plans emulated workers that way and reads what they report."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from smetric_router.core.port_file import read_port_file, write_port_file
from smetric_router.launch import ClusterSpec, PdSpec, RouterSpec, Stack, WorkerSpec, plan_workers
from smetric_router.launch.stack import dry_run
from tests.reported import reported


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def test_port_file_round_trip_and_bad_content(tmp_path: Path) -> None:
    path = tmp_path / "ports.json"
    assert read_port_file(path) is None
    write_port_file(path, {"http": 41001, "kv_events": 41002})
    assert read_port_file(path) == {"http": 41001, "kv_events": 41002}
    assert [p.name for p in tmp_path.iterdir()] == ["ports.json"]  # no temporary left behind
    path.write_text('{"http": "41001"}')
    with pytest.raises(ValueError, match="names to port numbers"):
        read_port_file(path)


def test_emulated_worker_binds_ports_0_and_reports_them(tmp_path: Path) -> None:
    argv = ["smetric_router.emulator", "--port", "0", "--kv-events-port", "0",
            "--kv-events-replay-port", "0", "--role", "prefill",
            "--disaggregation-bootstrap-port", "0", "--log-level", "warning"]  # fmt: skip
    with reported(argv, tmp_path / "w.json") as ports:
        assert set(ports) == {"http", "kv_events", "kv_events_replay", "bootstrap"}
        assert 0 not in ports.values() and len(set(ports.values())) == 4
        info = _get(f"http://127.0.0.1:{ports['http']}/server_info")
        # /server_info reports the ports bound, as SGLang reports the ones it was given
        assert info["port"] == ports["http"]
        assert info["disaggregation_bootstrap_port"] == ports["bootstrap"]
        assert info["kv_events"]["endpoint_port_base"] == ports["kv_events"]
        assert info["kv_events"]["replay_endpoint_port_base"] == ports["kv_events_replay"]
        assert json.loads(info["kv_events_config"])["endpoint"].endswith(f":{ports['kv_events']}")


def test_router_binds_port_0_and_reports_it(tmp_path: Path) -> None:
    argv = ["smetric_router", "--port", "0", "--prometheus-port", "0", "--log-level", "warning"]
    with reported(argv, tmp_path / "r.json") as ports:
        assert set(ports) == {"http", "prometheus"} and 0 not in ports.values()
        assert _get(f"http://127.0.0.1:{ports['http']}/health")["status"] == "ok"
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['prometheus']}/metrics") as r:
            assert b"smetric_requests_total" in r.read()


def test_emulated_plan_gives_ports_0_unless_a_base_port_is_set() -> None:
    pd = ClusterSpec(pd=PdSpec(prefill=1, decode=1))
    for w in plan_workers(pd):
        assert w.reports_ports and w.url == "http://127.0.0.1:0"
        ports = [w.argv[i + 1] for i, a in enumerate(w.argv) if a.endswith("port")]
        assert ports and set(ports) == {"0"}, w.argv
    assert "binds free ports, reported with --port-file" in dry_run(pd)
    fixed = plan_workers(ClusterSpec(workers=WorkerSpec(count=2, base_port=42000)))
    assert [(w.url, w.reports_ports) for w in fixed] == [
        ("http://127.0.0.1:42000", False), ("http://127.0.0.1:42003", False)
    ]  # fmt: skip


def test_stack_with_ports_0_knows_the_bound_urls() -> None:
    spec = ClusterSpec(router=RouterSpec(port=0), workers=WorkerSpec(count=2, speedup=20.0))
    stack = Stack(spec)
    try:
        stack.start()
        assert not stack.url.endswith(":0")
        listed = [w["url"] for w in _get(stack.url + "/workers")["workers"]]
        assert listed == stack.worker_urls and not any(u.endswith(":0") for u in listed)
        for url in stack.worker_urls:
            assert _get(url + "/server_info")["kv_events"]["endpoint_port_base"] > 0
    finally:
        stack.stop()
    assert all(c.proc is not None and c.proc.poll() is not None for c in stack.children)


def test_a_worker_dying_before_it_reports_is_a_clear_error() -> None:
    spec = ClusterSpec(workers=WorkerSpec(count=1, extra_args=("--speedup", "-1")))
    stack = Stack(spec)
    try:
        with pytest.raises(RuntimeError, match="worker-0 exited with code 2 during start-up"):
            stack.start_workers()
    finally:
        stack.stop()
