"""launch/emulated-mooncake.yaml: emulated workers on a real Mooncake master. Their command lines
and environment, then the stack started for real (master, workers, router) and stopped with the
master last, after the workers have taken their segments out of the store."""

from __future__ import annotations

import json
import sys
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from smetric_router.launch import ClusterSpec, PdSpec, Stack, load_spec, plan_workers
from smetric_router.launch.kinds.sglang import mooncake_master_argv
from smetric_router.launch.ports import free_ports
from smetric_router.launch.stack import MASTER, Child
from tests.helpers.polling import eventually_sync
from tests.mooncake_keys import (
    capacity,
    pages_present,
    pure_client,
    require_mooncake,
    sglang_page_keys,
)
from tests.mooncake_master import Master

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "launch" / "emulated-mooncake.yaml"
SEGMENT = 64 << 20


def test_every_emulated_worker_gets_the_store_and_the_master_is_beside_this_python() -> None:
    spec = load_spec(SPEC)
    assert spec.workers.kind == "emulated" and spec.mooncake is not None
    master = mooncake_master_argv(spec)
    assert master is not None and "--rpc_port=50152" in master
    beside = Path(sys.executable).parent / "mooncake_master"
    assert master[0] == (str(beside) if beside.exists() else "mooncake_master")
    plan = plan_workers(spec)
    assert len(plan) == 4
    for w in plan:
        argv, env = w.argv, dict(w.env)
        assert argv[argv.index("--global-tier") + 1] == "mooncake"
        assert env["MOONCAKE_MASTER"] == "127.0.0.1:50152"
        assert env["MOONCAKE_TE_META_DATA_SERVER"] == "http://127.0.0.1:18081/metadata"
        assert env["MOONCAKE_PROTOCOL"] == "tcp" and env["MOONCAKE_GLOBAL_SEGMENT_SIZE"] == "1gb"
        assert env["MOONCAKE_LOCAL_HOSTNAME"] == env["MC_TCP_BIND_ADDRESS"] == "127.0.0.1"


def test_the_pd_spec_with_a_tier_is_the_pd_default_on_its_own_master() -> None:
    spec = load_spec(ROOT / "launch" / "emulated-pd-mooncake.yaml")
    alone = load_spec(SPEC)
    assert spec.pd == PdSpec() and spec.workers == replace(alone.workers, count=spec.workers.count)
    assert spec.mooncake is not None and alone.mooncake is not None
    ports = {spec.mooncake.rpc_port, spec.mooncake.http_metadata_port, spec.mooncake.metrics_port}
    taken = {alone.mooncake.rpc_port, alone.mooncake.http_metadata_port,
             alone.mooncake.metrics_port}  # fmt: skip
    assert not ports & taken  # both clusters can run at once
    roles = [(w.role, "--global-tier" in w.argv) for w in plan_workers(spec)]
    assert roles == [("prefill", True)] * 4 + [("decode", False)] * 2


def test_pd_decode_instances_have_no_l3() -> None:
    spec = replace(load_spec(SPEC), pd=PdSpec(prefill=2, decode=1))
    for w in plan_workers(spec):
        assert ("--global-tier" in w.argv) == (w.role == "prefill"), w.argv
        assert ("MOONCAKE_MASTER" in dict(w.env)) == (w.role == "prefill")


def test_without_a_global_tier_nothing_changes() -> None:
    for w in plan_workers(ClusterSpec()):
        assert "--global-tier" not in w.argv and not w.env


def test_the_spec_starts_serves_from_the_store_and_stops_the_master_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    require_mooncake()
    monkeypatch.setenv("MC_TCP_BIND_ADDRESS", "127.0.0.1")  # this test's own pure client
    rpc, http, metrics = free_ports(3)
    base = load_spec(SPEC)
    assert base.mooncake is not None
    spec = replace(
        base,
        router=replace(base.router, port=0),
        workers=replace(base.workers, count=2, speedup=20.0),
        mooncake=replace(base.mooncake, rpc_port=rpc, http_metadata_port=http,
                         metrics_port=metrics, global_segment_size=str(SEGMENT)),
    )  # fmt: skip
    view = Master()  # not started: the launcher's master, seen through the same helpers
    view.rpc, view.http, view.metrics = rpc, http, metrics
    stack = Stack(spec)
    with stack:
        assert stack.children[0].name == MASTER
        for url in stack.worker_urls:
            info = _get(f"{url}/server_info")
            assert info["hicache_storage_backend"] == "mooncake", info
            assert info["emulator_global_tier"]["up"] is True, info
        assert capacity(view) == 2 * SEGMENT  # both lent theirs

        # a prompt served through the router lands in the store under SGLang's keys
        ids = [500 + (i * 13) % 9000 for i in range(8 * 16)] + [3]
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 2}}
        req = urllib.request.Request(
            f"{stack.url}/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status == 200
        keys = sglang_page_keys(spec.workers.model_name, ids[: 8 * 16], 16)
        checker = pure_client(view)
        eventually_sync(
            lambda: pages_present(checker, keys) == [1] * 8, "the prompt's pages in the store"
        )
        checker.close()  # before the master goes

        rounds: list[list[str]] = []
        lent: list[float] = []  # the store's capacity as the master is stopped
        real_stop = stack._stop

        def record(children: list[Child]) -> None:
            rounds.append([c.name for c in children])
            try:
                if children and children[0].name == MASTER:
                    lent.append(capacity(view))
            finally:
                real_stop(children)

        monkeypatch.setattr(stack, "_stop", record)
    assert rounds == [["worker-0", "worker-1", "router"], [MASTER]]
    assert lent == [0]  # the workers had gone and taken their segments out of the store
    assert all(c.proc is not None and c.proc.poll() is not None for c in stack.children)


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)
