"""launch/sglang-cpu-pd.yaml: real SGLang prefill and decode command lines (nothing started)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from smetric_router.launch import PdSpec, load_spec, plan_workers, router_args

ROOT = Path(__file__).resolve().parents[2]


def _flag(argv: tuple[str, ...], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_committed_cpu_pd_spec_plans_a_prefill_decode_pair_over_mooncake_tcp() -> None:
    spec = load_spec(ROOT / "launch" / "sglang-cpu-pd.yaml")
    assert spec.workers.kind == "sglang" and spec.pd == PdSpec(prefill=1, decode=1)
    # two prefills, a model directory (no tiny model generated), fixed ports
    spec = replace(
        spec,
        pd=replace(spec.pd, prefill=2),
        workers=replace(spec.workers, base_port=42000),
        sglang=replace(spec.sglang, model_path="/models/m"),
    )
    plan = plan_workers(spec)
    assert [(w.name, w.role) for w in plan] == [
        ("prefill-0", "prefill"), ("prefill-1", "prefill"), ("decode-0", "decode")
    ]  # fmt: skip
    for w in plan:
        assert _flag(w.argv, "--disaggregation-mode") == w.role
        assert _flag(w.argv, "--disaggregation-transfer-backend") == "mooncake_tcp"
        env = dict(w.env)
        assert env["SGLANG_HOST_IP"] == env["MC_TCP_BIND_ADDRESS"] == "127.0.0.1"
        assert env["SMETRIC_SGLANG_CPU"] == "1"
    p0, p1, d = plan
    # each prefill has its own bootstrap server, passed to SGLang and to the router
    assert p0.bootstrap_port != p1.bootstrap_port and d.bootstrap_port is None
    for p in (p0, p1):
        assert _flag(p.argv, "--disaggregation-bootstrap-port") == str(p.bootstrap_port)
        assert "--kv-events-config" in p.argv and "--enable-hierarchical-cache" in p.argv
    # the decode: no bootstrap server, no KV events, no HiCache (SGLang disables its radix cache)
    assert "--disaggregation-bootstrap-port" not in d.argv
    assert "--kv-events-config" not in d.argv and "--enable-hierarchical-cache" not in d.argv
    args = router_args(spec, plan)
    assert args[args.index("--pd-disaggregation") :] == [
        "--pd-disaggregation", "--prefill-policy", "smetric",
        "--prefill", p0.url, str(p0.bootstrap_port), "--prefill", p1.url, str(p1.bootstrap_port),
        "--decode", d.url,
    ]  # fmt: skip


def test_colocated_sglang_workers_get_no_mooncake_bind_address() -> None:
    spec = load_spec(ROOT / "launch" / "sglang-cpu.yaml")
    spec = replace(spec, sglang=replace(spec.sglang, model_path="/models/m"))
    assert all("MC_TCP_BIND_ADDRESS" not in dict(w.env) for w in plan_workers(spec))
