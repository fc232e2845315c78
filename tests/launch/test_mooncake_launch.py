"""launch/sglang-cpu-mooncake.yaml: the master's and workers' command lines and environment, and
the stop order (the master after everything else). Nothing of SGLang is started."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from smetric_router.launch import ClusterSpec, Stack, load_spec, plan_workers
from smetric_router.launch.kinds.sglang import mooncake_master_argv
from smetric_router.launch.stack import MASTER, Child

ROOT = Path(__file__).resolve().parents[2]


def test_committed_cpu_mooncake_spec_gives_every_worker_the_master() -> None:
    spec = load_spec(ROOT / "launch" / "sglang-cpu-mooncake.yaml")
    assert spec.mooncake is not None and spec.sglang.hicache_storage_backend == "mooncake"
    spec = replace(
        spec, sglang=replace(spec.sglang, model_path="/models/m", python="/v/bin/python")
    )
    master = mooncake_master_argv(spec)
    assert master is not None and master[0] == "mooncake_master"  # /v/bin has none: from PATH
    assert "--rpc_address=127.0.0.1" in master and "--rpc_port=50151" in master
    assert "--http_metadata_server_port=18080" in master and "--metrics_port=19003" in master
    assert "--enable_metric_reporting=false" in master  # its 10-s status line off the console
    plan = plan_workers(spec)
    assert len(plan) == 2
    for w in plan:
        argv, env = w.argv, dict(w.env)
        assert argv[argv.index("--hicache-storage-backend") + 1] == "mooncake"
        assert argv[argv.index("--hicache-mem-layout") + 1] == "page_first_direct"
        assert argv[argv.index("--hicache-storage-prefetch-policy") + 1] == "wait_complete"
        assert env["MOONCAKE_MASTER"] == "127.0.0.1:50151"
        assert env["MOONCAKE_TE_META_DATA_SERVER"] == "http://127.0.0.1:18080/metadata"
        assert env["MOONCAKE_GLOBAL_SEGMENT_SIZE"] == "1gb"
        assert env["MOONCAKE_LOCAL_HOSTNAME"] == env["MC_TCP_BIND_ADDRESS"] == "127.0.0.1"


def test_the_master_is_found_beside_the_sglang_interpreter(tmp_path: Path) -> None:
    (tmp_path / "python").touch()
    (tmp_path / "mooncake_master").touch()
    spec = load_spec(ROOT / "launch" / "sglang-cpu-mooncake.yaml")
    spec = replace(spec, sglang=replace(spec.sglang, python=str(tmp_path / "python")))
    master = mooncake_master_argv(spec)
    assert master is not None and master[0] == str(tmp_path / "mooncake_master")


def test_stop_takes_the_master_down_after_everything_else(monkeypatch: pytest.MonkeyPatch) -> None:
    stack = Stack(ClusterSpec())
    names = [MASTER, "worker-0", "worker-1", "router"]  # start order
    procs = [subprocess.Popen(["sleep", "30"], start_new_session=True) for _ in names]
    stack.children = [Child(n, p, "") for n, p in zip(names, procs, strict=True)]
    rounds: list[list[str]] = []
    real = stack._stop

    def record(children: list[Child]) -> None:
        rounds.append([c.name for c in children])
        real(children)
        assert procs[0].poll() is None or rounds[-1] == [MASTER]  # the master outlives the rest

    monkeypatch.setattr(stack, "_stop", record)
    stack.stop()
    assert rounds == [["worker-0", "worker-1", "router"], [MASTER]]
    assert all(p.poll() is not None for p in procs)
