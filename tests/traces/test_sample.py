"""Sampling sessions to control the rate: whole sessions at their original timing, reproducible,
nested across fractions."""

from __future__ import annotations

from pathlib import Path

import pytest

from smetric_router.sim.__main__ import main
from smetric_router.traces.sample import sample_sessions
from smetric_router.traces.schema import TraceRequest


def _trace(sessions: int, turns: int) -> list[TraceRequest]:
    return [
        TraceRequest(
            f"{s}-{k}",
            s * 0.5 + k * 3.0,
            f"s{s}",
            f"{s}-{k - 1}" if k else None,
            k,
            32 * (k + 1),
            8,
            tuple(range(2 * (k + 1))),
            16,
        )
        for s in range(sessions)
        for k in range(turns)
    ]


def test_whole_sessions_are_kept_at_their_timing() -> None:
    trace = _trace(1000, 3)
    kept = sample_sessions(trace, 0.3, seed=1)
    sessions = {r.session for r in kept}
    assert 250 < len(sessions) < 350
    assert len(kept) == 3 * len(sessions)  # every turn of a kept session, none of the others
    assert kept == [r for r in trace if r.session in sessions]  # same requests, same times


def test_same_seed_same_sessions_and_more_is_a_superset() -> None:
    trace = _trace(400, 2)
    small = {r.session for r in sample_sessions(trace, 0.3, seed=7)}
    large = {r.session for r in sample_sessions(trace, 0.6, seed=7)}
    assert small == {r.session for r in sample_sessions(list(reversed(trace)), 0.3, seed=7)}
    assert small < large
    assert small != {r.session for r in sample_sessions(trace, 0.3, seed=8)}
    assert len(sample_sessions(trace, 1.0, seed=7)) == len(trace)


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5])
def test_a_fraction_outside_0_1_is_refused(fraction: float) -> None:
    with pytest.raises(ValueError, match="fraction"):
        sample_sessions(_trace(2, 1), fraction, seed=0)


def test_sim_cli_refuses_a_sampled_rate_above_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"chat_id": 1, "timestamp": 0, "input_length": 16, "output_length": 2, '
                     '"hash_ids": [1]}\n')  # fmt: skip
    argv = ["--trace", str(trace), "--sample-sessions", "1", "--rate-scale", "1.5"]
    assert main([*argv, "--no-progress"]) == 2
    assert "fraction <= 1" in capsys.readouterr().err
