from __future__ import annotations

from pathlib import Path

import pytest

from smetric_router.launch import ClusterSpec, build_parser, load_spec, resolve_spec

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
        ("workers: {kind: sglang}\n", "not supported"),
        ("workers: {count: 0}\n", "count must be >= 1"),
        ("- a\n- b\n", "expected a mapping"),
    ],
)
def test_bad_specs_are_rejected_clearly(tmp_path: Path, text: str, message: str) -> None:
    p = tmp_path / "spec.yaml"
    p.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_spec(p)
