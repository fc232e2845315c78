"""The admission flags: off by default (nothing on the request path), parsed into the gate's
settings when a bound is set, refused when negative."""

from __future__ import annotations

from typing import Any

import pytest

from smetric_router.admission.gate import AdmissionConfig
from smetric_router.router.app import RouterState, admission_headers, build_app
from smetric_router.router.cli import config_from_args
from smetric_router.router.config import RouterConfig


def _no_features(page_size: int) -> Any:
    raise AssertionError("not called before the router starts")


def test_off_by_default_leaves_no_gate_and_no_response_hook() -> None:
    config = config_from_args([])
    assert config.admission() is None
    state = RouterState(config, _no_features, None, None, None)
    assert state.admission is None
    assert admission_headers not in build_app(state).on_response_prepare
    assert "smetric_admission_queued" not in state.metrics.render().decode()


def test_flags_make_the_gates_settings() -> None:
    config = config_from_args(["--max-concurrent-requests", "8", "--queue-size", "3",
                               "--queue-timeout-secs", "2.5",
                               "--queue-first-turn-ceiling-secs", "1"])  # fmt: skip
    assert config.admission() == AdmissionConfig(8, 3, 2.5, 1.0, 0)
    per_worker = RouterConfig(max_queued_requests_per_worker=4).admission()
    assert per_worker == AdmissionConfig(None, 100, 60.0, 5.0, 4)
    kept = config_from_args(["--max-concurrent-requests", "8", "--queue-session-grace-secs", "2"])
    assert kept.admission() == AdmissionConfig(8, 100, 60.0, 5.0, 0, session_grace_s=2.0)
    state = RouterState(config, _no_features, None, None, None)
    assert state.admission is not None
    assert admission_headers in build_app(state).on_response_prepare
    assert 'smetric_admission_queued{tenant="anonymous"} 0.0' in state.metrics.render().decode()


def test_retry_after_is_the_timeout_in_whole_seconds_within_bounds() -> None:
    assert AdmissionConfig(1, 1, 2.5, 5.0, 0).retry_after == 3
    assert AdmissionConfig(1, 1, 0.1, 5.0, 0).retry_after == 1
    assert AdmissionConfig(1, 1, 600.0, 5.0, 0).retry_after == 60


@pytest.mark.parametrize(
    "argv",
    [["--max-concurrent-requests", "-1"], ["--queue-size", "-1"], ["--queue-timeout-secs", "0"],
     ["--max-queued-requests-per-worker", "-2"], ["--queue-session-grace-secs", "1"],
     ["--max-concurrent-requests", "4", "--queue-session-grace-secs", "-1"]],
)  # fmt: skip
def test_bad_admission_flags_exit_with_usage_error(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        config_from_args(argv)
    assert e.value.code == 2
