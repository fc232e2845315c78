from __future__ import annotations

from pathlib import Path

import pytest

from smetric_router.launch import (
    ClusterSpec,
    PdSpec,
    WorkerSpec,
    build_parser,
    load_spec,
    plan_workers,
    resolve_spec,
    router_args,
)
from smetric_router.launch.tiny_model import TEMPLATE

ROOT = Path(__file__).resolve().parents[2]


def test_committed_spec_is_the_embedded_default() -> None:
    assert load_spec(ROOT / "launch" / "emulated.yaml") == ClusterSpec()


def test_flags_override_the_spec() -> None:
    argv = ["--workers", "8", "--policy", "load_balance", "--port", "1234"]
    args = build_parser().parse_args(argv)
    spec = resolve_spec(args)
    assert (spec.workers.count, spec.router.policy, spec.router.port) == (8, "load_balance", 1234)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("router: {prot: 1}\n", "unknown keys"),
        ("routers: {}\n", "unknown sections"),
        ("workers: {kind: vllm}\n", "is unknown"),
        ("workers: {count: 0}\n", "count must be >= 1"),
        ("- a\n- b\n", "expected a mapping"),
        ("workers: {speedup: fast}\n", r"Expected `float`, got `str` - at `workers.speedup`"),
        ('router: {port: "30000"}\n', r"Expected `int`, got `str` - at `router.port`"),
        ('workers: {count: "4"}\n', r"Expected `int`, got `str` - at `workers.count`"),
        ("workers: {kind: sglang}\nsglang: {hicache: maybe}\n", r"at `sglang.hicache`"),
        ("mooncake: {rpc_port: 1.5}\nglobal_tier: mooncake\n", r"at `mooncake.rpc_port`"),
    ],
)
def test_bad_specs_are_rejected_clearly(tmp_path: Path, text: str, message: str) -> None:
    p = tmp_path / "spec.yaml"
    p.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_spec(p)


def test_numbers_in_flag_lists_and_an_env_mapping_are_read_as_strings(tmp_path: Path) -> None:
    p = tmp_path / "spec.yaml"
    p.write_text("workers: {kind: sglang, speedup: 2, extra_args: [--gpu-kv-tokens, 50000]}\n"
                 "sglang: {env: {SGLANG_X: 1}}\n")  # fmt: skip
    spec = load_spec(p)
    assert spec.workers.extra_args == ("--gpu-kv-tokens", "50000")
    assert spec.workers.speedup == 2.0 and isinstance(spec.workers.speedup, float)
    assert spec.sglang.env == (("SGLANG_X", "1"),)


def test_committed_pd_spec_is_the_pd_default() -> None:
    assert load_spec(ROOT / "launch" / "emulated-pd.yaml") == ClusterSpec(pd=PdSpec())


def test_pd_router_gets_sglang_router_pd_flags() -> None:
    spec = ClusterSpec(
        workers=WorkerSpec(base_port=41000),
        pd=PdSpec(prefill=2, decode=1, decode_policy="least_tokens"),
    )
    plan = plan_workers(spec)
    assert [(w.name, w.role) for w in plan] == [
        ("prefill-0", "prefill"), ("prefill-1", "prefill"), ("decode-0", "decode")
    ]  # fmt: skip
    # prefill: HTTP, KV events, replay, bootstrap; decode: HTTP only
    assert [w.url for w in plan] == [
        "http://127.0.0.1:41000", "http://127.0.0.1:41004", "http://127.0.0.1:41008"
    ]  # fmt: skip
    assert [w.bootstrap_port for w in plan] == [41003, 41007, None]
    assert "--role" in plan[0].argv and plan[0].argv[plan[0].argv.index("--role") + 1] == "prefill"
    assert "--kv-events-port" not in plan[2].argv
    args = router_args(spec, plan)
    tail = args[args.index("--pd-disaggregation") :]
    assert tail == [
        "--pd-disaggregation", "--prefill-policy", "smetric", "--decode-policy", "least_tokens",
        "--prefill", "http://127.0.0.1:41000", "41003",
        "--prefill", "http://127.0.0.1:41004", "41007",
        "--decode", "http://127.0.0.1:41008",
    ]  # fmt: skip
    assert "--worker-urls" not in args


def test_colocated_router_args_list_every_worker() -> None:
    spec = ClusterSpec(workers=WorkerSpec(count=2, base_port=42000))
    args = router_args(spec, plan_workers(spec))
    i = args.index("--worker-urls")
    assert args[i + 1 : i + 3] == ["http://127.0.0.1:42000", "http://127.0.0.1:42003"]
    assert args[args.index("--policy") + 1] == "smetric"
    assert "--pd-disaggregation" not in args


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("workers: {count: 2}\npd: {}\n", "workers.count does not apply"),
        ("pd: {prefill: 0}\n", "must be >= 1"),
        ("pd: {prefills: 2}\n", "unknown keys"),
    ],
)
def test_bad_pd_specs_are_rejected_clearly(tmp_path: Path, text: str, message: str) -> None:
    p = tmp_path / "spec.yaml"
    p.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_spec(p)


def test_workers_flag_does_not_apply_to_a_pd_spec() -> None:
    args = build_parser().parse_args(
        ["--config", str(ROOT / "launch" / "emulated-pd.yaml"), "--workers", "3"]
    )
    with pytest.raises(ValueError, match="does not apply to a PD spec"):
        resolve_spec(args)


@pytest.mark.parametrize("template", ["qwen3-coder", "tokenizer", "custom"])
def test_emulated_workers_and_router_render_with_one_template(
    tmp_path: Path, template: str
) -> None:
    custom = tmp_path / "t.jinja"
    custom.write_text("{{ messages }}")
    name = str(custom) if template == "custom" else template
    spec = ClusterSpec(workers=WorkerSpec(count=2, chat_template=name))
    workers = plan_workers(spec)
    every = [list(w.argv) for w in workers] + [router_args(spec, workers)]
    for argv in every:
        given = argv[argv.index("--chat-template") + 1] if "--chat-template" in argv else None
        want = {"qwen3-coder": str(TEMPLATE), "tokenizer": None, "custom": str(custom)}
        assert given == want[template], argv


def test_a_missing_chat_template_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"workers\.chat_template"):
        plan_workers(ClusterSpec(workers=WorkerSpec(chat_template="nope.jinja")))
