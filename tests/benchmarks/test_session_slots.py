"""benchmarks/session_slots.py: the report end to end on a tiny trace (the kept slots themselves:
tests/sim/test_admission.py, tests/admission/test_slots.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import repro_colocated as rc
from benchmarks import session_slots as ss
from tests.helpers.study import tiny_study


def test_the_report_end_to_end_on_a_tiny_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tiny_study(
        monkeypatch, tmp_path, rc.Study(sessions=20, limit=60, seeds=(1,), min_requests=40)
    )
    monkeypatch.setattr(ss, "RATES", (1.0,))
    monkeypatch.setattr(ss, "NO_TIER_RATES", (0.5,))
    monkeypatch.setattr(ss, "CAPS", (4,))
    with pytest.raises(SystemExit, match="not cached"):
        ss.main(["--report-only"])
    ss.main([])
    text = (results / "session-slots.md").read_text()
    full, none = text.split("## Without a global tier")
    assert "| 1x | smetric, cap 4, slots kept 1 s |" in full
    assert "| 1x | lmetric, no cap |" in full
    assert "lmetric-inflight" not in full
    assert "| 0.5x | smetric, cap 4, slots kept 1 s |" in none
    assert "| 0.5x | lmetric-inflight, no cap |" in none
    ss.main(["--report-only"])  # every run now cached
