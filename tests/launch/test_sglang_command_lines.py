"""Every SGLang command line the launcher generates is accepted by SGLang 0.5.23's own ServerArgs
parser (run in the CPU SGLang environment), so a renamed or misspelled flag fails here."""

from __future__ import annotations

import json

import pytest

from smetric_router.launch import ClusterSpec, load_spec, plan_workers
from smetric_router.launch.stack import dry_run
from tests.helpers.server_args import parse_server_args
from tests.sglang_env import REPO

pytestmark = pytest.mark.sglang

SPECS = [
    "sglang-cpu.yaml",
    "sglang-cpu-pd.yaml",
    "sglang-cpu-mooncake.yaml",
    "sglang-h20.yaml",
    "sglang-h20-pd.yaml",
]


def server_argv(spec: ClusterSpec) -> list[list[str]]:
    workers = plan_workers(spec)
    for w in workers:
        assert w.argv[1:3] == ("-m", "sglang.launch_server"), w.argv
    return [list(w.argv[3:]) for w in workers]


def test_committed_specs_parse_with_sglangs_own_parser() -> None:
    specs = {name: load_spec(REPO / "launch" / name) for name in SPECS}
    argvs = {name: server_argv(spec) for name, spec in specs.items()}
    flat = [a for name in SPECS for a in argvs[name]]
    parsed = iter(parse_server_args(flat))
    for name in SPECS:
        spec = specs[name]
        results = [next(parsed) for _ in argvs[name]]
        errors = [r["error"] for r in results if "error" in r]
        assert not errors, (name, errors)
        roles = [w.role for w in plan_workers(spec)]
        for role, r in zip(roles, results, strict=True):
            assert r["page_size"] == spec.workers.page_size and r["enable_cache_report"]
            assert r["disaggregation_mode"] == role
            if role != "decode":
                kv = json.loads(r["kv_events_config"])
                assert kv["publisher"] == "zmq" and kv["bind"] is True and kv["replay_endpoint"]
                assert r["enable_hierarchical_cache"] is spec.sglang.hicache
                if spec.mooncake is not None:
                    assert r["hicache_storage_backend"] == "mooncake"
            if role == "prefill":
                assert r["disaggregation_bootstrap_port"] is not None
        assert (spec.sglang.device == "cpu") == all(r["device"] == "cpu" for r in results)


def test_a_misspelled_flag_is_caught() -> None:
    spec = load_spec(REPO / "launch" / "sglang-cpu.yaml")
    argv = server_argv(spec)[0] + ["--enable-cache-reports"]
    (result,) = parse_server_args([argv])
    assert "unrecognized arguments: --enable-cache-reports" in result["error"]


def test_h20_dry_run_prints_every_host() -> None:
    spec = load_spec(REPO / "launch" / "sglang-h20-pd.yaml")
    text = dry_run(spec)
    for host in ("h20-node-0", "h20-node-1", "h20-node-2", "h20-node-3", "this machine"):
        assert f"## on {host}\n" in text
    assert text.count("--disaggregation-mode prefill") == 16
    assert text.count("--disaggregation-mode decode") == 16
    assert text.count("mooncake_master --rpc_address") == 1
    # 8 workers per node, each on its own GPU
    node2 = text.split("## on h20-node-2\n")[1].split("## on")[0]
    assert sorted(f"CUDA_VISIBLE_DEVICES={g} " in node2 for g in range(8)) == [True] * 8
