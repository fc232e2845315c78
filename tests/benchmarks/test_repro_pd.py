"""benchmarks/repro_pd.py end to end at a tiny size: the PD study runs in the simulator's tier
modes and writes its figure file with the command that made it."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import repro_pd


@pytest.mark.parametrize("mode", ["paper", "hicache"])
def test_the_pd_study_at_a_tiny_size(tmp_path: Path, mode: str) -> None:
    argv = [
        "--out", str(tmp_path), "--sessions", "4", "--instances", "4",
        "--durations", "120,80", "--global-ratios", "0,inf", "--tier-mode", mode,
        "--policies", "smetric,load_balance", "--jobs", "2",
    ]  # fmt: skip
    assert repro_pd.main(argv) == 0
    doc = orjson.loads((tmp_path / "fig21_23_pd.json").read_bytes())
    assert len(doc["results"]) == 2 * 2 * 2
    assert {r["tier_mode"] for r in doc["results"]} == {mode}
    text = (tmp_path / "fig21_23_pd.md").read_text()
    assert "python benchmarks/repro_pd.py --out" in text
    assert f"tier mode `{mode}`" in text
    for png in ("fig21a_pd_rate_sweep", "fig22a_pd_global_tier", "fig23_pd_ttft_cdf"):
        assert (tmp_path / f"{png}.png").stat().st_size > 0
