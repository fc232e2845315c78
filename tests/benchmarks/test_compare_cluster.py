"""The cluster benchmarks.compare runs: a --config's, with the worker flags applied over it."""

from __future__ import annotations

import pytest

from benchmarks.compare import build_parser, cluster_spec, setup_from
from smetric_router.launch import PdSpec, WorkerLaunch
from smetric_router.launch.spec import ClusterSpec

MOONCAKE = "launch/emulated-mooncake.yaml"
PD_MOONCAKE = "launch/emulated-pd-mooncake.yaml"


def spec_for(*argv: str) -> ClusterSpec:
    a = build_parser().parse_args(list(argv))
    return cluster_spec(a, setup_from(a))


def test_worker_flags_apply_over_a_config() -> None:
    plain = spec_for("--config", MOONCAKE)
    given = spec_for("--config", MOONCAKE, "--workers", "8", "--speedup", "0.5",
                     "--gpu-kv-tokens", "50000", "--routers", "smetric")  # fmt: skip
    assert plain.workers.speedup == 1.0
    assert (given.workers.count, given.workers.speedup) == (8, 0.5)
    assert given.workers.extra_args[-2:] == ("--gpu-kv-tokens", "50000")
    assert given.mooncake is not None and given.mooncake == plain.mooncake  # the rest stays


def test_an_emulated_flag_on_real_workers_is_an_error() -> None:
    with pytest.raises(SystemExit, match="--speedup: only for emulated workers"):
        spec_for("--config", "launch/sglang-cpu.yaml", "--speedup", "2")


def test_without_a_config_the_flags_make_the_cluster() -> None:
    spec = spec_for("--workers", "3", "--speedup", "2")
    assert (spec.workers.kind, spec.workers.count, spec.workers.speedup) == ("emulated", 3, 2.0)


def test_a_pd_cluster_refuses_a_worker_count_and_says_what_it_runs() -> None:
    from benchmarks.compare import cluster_line

    with pytest.raises(SystemExit, match=r"--workers: .* sets how many of each"):
        spec_for("--config", PD_MOONCAKE, "--workers", "8")
    line = cluster_line(spec_for("--config", PD_MOONCAKE, "--speedup", "0.25"))
    assert line.startswith("emulated workers disaggregated, 4 prefill and 2 decode (KV link 200")
    assert "speedup 0.25" in line
    assert cluster_line(spec_for("--workers", "3")).startswith("3 emulated workers (")


def test_peer_routers_get_both_roles_under_pd() -> None:
    from benchmarks.compare import peer_workers

    launched = [
        WorkerLaunch("p0", "http://127.0.0.1:1", ("x",), role="prefill", bootstrap_port=8998),
        WorkerLaunch("d0", "http://127.0.0.1:2", ("x",), role="decode"),
        WorkerLaunch("p1", "http://127.0.0.1:3", ("x",), role="prefill", bootstrap_port=8999),
    ]
    urls = [w.url for w in launched]
    assert peer_workers(PdSpec(), launched, urls) == [
        "--pd-disaggregation",
        "--prefill", "http://127.0.0.1:1", "8998",
        "--decode", "http://127.0.0.1:2",
        "--prefill", "http://127.0.0.1:3", "8999",
    ]  # fmt: skip
    assert peer_workers(None, launched, urls) == ["--worker-urls", *urls]


def test_priority_scheduling_reaches_every_worker_when_asked_or_a_router_needs_it() -> None:
    flag, args = "--enable-priority-scheduling", ("--default-priority-value", "0")
    assert flag not in spec_for("--config", MOONCAKE, "--routers", "smetric").workers.extra_args
    asked = spec_for("--config", MOONCAKE, flag, "--routers", "smetric")
    assert asked.workers.extra_args[-3:] == (flag, *args)
    needed = spec_for("--config", MOONCAKE, "--routers", "smetric,smetric-prio1")
    assert needed.workers.extra_args.count(flag) == 1
    both = spec_for("--config", MOONCAKE, flag, "--routers", "smetric-prio1")
    assert both.workers.extra_args.count(flag) == 1
    real = spec_for("--config", "launch/sglang-cpu.yaml", flag)
    assert real.workers.extra_args[-3:] == (flag, *args)  # SGLang's own flags
