"""benchmarks/repro_pd.py end to end at a tiny size: the PD study runs in the simulator's tier
modes and writes its figure file with the command that made it."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import orjson
import pytest

from smetric_router.sim.tiers import Tiers

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import repro_pd


@pytest.mark.parametrize("mode", ["paper", "hicache"])
def test_the_pd_study_at_a_tiny_size(tmp_path: Path, mode: str) -> None:
    argv = [
        "--out", str(tmp_path), "--sessions", "4", "--instances", "4",
        "--durations", "120,80", "--global-ratios", "0,inf", "--tier-mode", mode,
        "--policies", "smetric,load_balance", "--jobs", "2", "--seeds", "1,2",
    ]  # fmt: skip
    assert repro_pd.main(argv) == 0
    doc = orjson.loads((tmp_path / "fig21_23_pd.json").read_bytes())
    assert len(doc["results"]) == 2 * 2 * 2 * 2
    assert {r["tier_mode"] for r in doc["results"]} == {mode}
    assert {r["seed"] for r in doc["results"]} == {1, 2}
    text = (tmp_path / "fig21_23_pd.md").read_text()
    assert "python benchmarks/repro_pd.py --out" in text
    assert f"tier mode `{mode}`" in text
    for png in ("fig21a_pd_rate_sweep", "fig22a_pd_global_tier", "fig23_pd_ttft_cdf"):
        assert (tmp_path / f"{png}.png").stat().st_size > 0


def _row(seed: int, policy: str, rate: float, tps: float) -> dict[str, object]:
    return {
        "seed": seed, "policy": policy, "global_ratio": 0.0, "rate_scale": rate,
        "prefill_tps_within_slo": tps,
    }  # fmt: skip


def test_the_headline_is_each_seeds_best_rate_then_the_spread() -> None:
    rows = [
        _row(1, "smetric", 0.5, 90.0), _row(1, "smetric", 1.0, 120.0),
        _row(1, "lmetric", 0.5, 100.0), _row(1, "lmetric", 1.0, 80.0),
        _row(2, "smetric", 0.5, 50.0), _row(2, "smetric", 1.0, 40.0),
        _row(2, "lmetric", 0.5, 30.0), _row(2, "lmetric", 1.0, 100.0),
    ]  # fmt: skip
    best, ratios = repro_pd.headline(rows, ["smetric", "lmetric"], 0.0)
    assert best == {"smetric": [120.0, 50.0], "lmetric": [100.0, 100.0]}
    assert ratios == pytest.approx([1.2, 0.5])
    table = repro_pd.tables(
        [{**r, "prefill_tps": 0.0, "ttft_p50": 0.0, "ttft_p90": 0.0, "ttft_p99": 0.0,
          "reuse_ratio": 0.0, "local_hit_ratio": 0.0, "global_hit_ratio": 0.0,
          "imbalance_mean": 0.0, "followup_stickiness": 0.0, "wall_s": 0.0} for r in rows],
        ["smetric", "lmetric"],
    )  # fmt: skip
    assert "| 0 | 85 [50–120] | 100 [100–100] | 0.850 [0.500–1.200] |" in table


def test_free_fetches_cost_no_time() -> None:
    """--free-fetches: a global-tier fetch adds nothing to the step that loads it, where the
    study's tier charges its overhead, its link transfer and its PCIe copy."""
    fetch = {}
    for free in (False, True):
        args = argparse.Namespace(instances=4, tier_mode="paper", free_fetches=free)
        cfg = repro_pd._config(args)
        engine = Tiers(cfg, repro_pd._timing(args, cfg), math.inf).engine(0)
        fetch[free] = engine.storage_fetch_seconds(16_000)
    assert fetch[True] == 0.0
    assert fetch[False] > 1.5e-3  # at least the per-fetch overhead
