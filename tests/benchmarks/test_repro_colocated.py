"""benchmarks/repro_colocated.py: cache keys that name every setting, spread over trace seeds,
per-window figures read from the run rows, and the figures end to end on a tiny trace."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import orjson
import pytest

from benchmarks import repro_colocated as rc
from smetric_router.policies import make_policy
from smetric_router.sim.cluster import Cluster
from smetric_router.sim.report import spread
from smetric_router.sim.tiers import Tiers
from tests.helpers.study import tiny_study


def test_the_cache_key_names_every_setting_and_the_code() -> None:
    base = rc.Spec("bailian", 1.5, lam=0.6)
    changed: dict[str, Any] = {
        "policy": "smetric",
        "rate": 2.0,
        "ratio": 1.6,
        "seed": 2,
        "tier_mode": "hicache",
        "nics": 2,
        "nic_gbps": 7.5,
        "fetch_ms": 2.0,
        "overload": 3.0,
        "move_cost": 1.0,
        "hit_ratio": 0.25,
        "lam": 0.7,
        "hints": True,
        "sample": 1,
        "instances": 8,
        "follow_ups": "on-reply",
        "pcie": False,
        "priority": 1,
        "cap": 64,
        "lead_in": 300.0,
    }
    assert set(changed) | {"prefetch"} == {f.name for f in dataclasses.fields(rc.Spec)}
    for name, value in changed.items():
        other = dataclasses.replace(base, **{name: value})
        assert other.key() != base.key(), name
    # the prefetch policy is HiCache's: it names HiCache runs and leaves paper runs alone
    hic = dataclasses.replace(base, tier_mode="hicache")
    assert dataclasses.replace(hic, prefetch="best_effort").key() != hic.key()
    assert rc.CODE_VERSION["model"] in base.key()
    assert rc.sim_config(dataclasses.replace(base, hints=True)).session_hints
    assert rc.sim_config(dataclasses.replace(base, follow_ups="on-reply")).follow_ups == "on-reply"
    assert not rc.sim_config(base).session_hints
    assert rc.sim_config(dataclasses.replace(base, priority=1)).follow_up_priority == 1
    assert rc.sim_config(dataclasses.replace(base, cap=64)).max_concurrent_requests == 64


def test_a_policys_key_follows_its_own_sources_only(monkeypatch: pytest.MonkeyPatch) -> None:
    keys = {p: rc.Spec(p, 1.5).key() for p in ("smetric", "lmetric")}
    assert all(rc.policy_hash(p) in k for p, k in keys.items())
    monkeypatch.setitem(rc.POLICY_HASH, "smetric", "edited")
    assert rc.Spec("smetric", 1.5).key() != keys["smetric"]
    assert rc.Spec("lmetric", 1.5).key() == keys["lmetric"]
    # read again from the same sources: the same hashes (the key is stable across processes)
    assert rc._policy_hashes() == rc.POLICY_HASH | {"smetric": rc._policy_hashes()["smetric"]}


def _hashes_after_editing(monkeypatch: pytest.MonkeyPatch, name: str) -> dict[str, str]:
    """The policy hashes as they would be with a line appended to policies/`name`."""
    read = Path.read_bytes

    def edited(self: Path) -> bytes:
        data = read(self)
        return data + b"# edited" if self.name == name else data

    monkeypatch.setattr(Path, "read_bytes", edited)
    return rc._policy_hashes()


def test_a_variant_registering_anothers_class_keys_on_its_own_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """smetric_fetch.py registers smetric's class with another cost: an edit there re-runs
    smetric-fetch's rows, not smetric's nor any other policy's."""
    before = rc._policy_hashes()
    after = _hashes_after_editing(monkeypatch, "smetric_fetch.py")
    assert {p for p in before if before[p] != after[p]} == {"smetric-fetch"}


def test_a_policy_built_from_anothers_parts_keys_on_their_modules_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """smetric_l3move.py (the default `smetric`, also named `smetric-l3move`) decides most
    requests with smetric-delay's cost and smetric.py's class: an edit to smetric_delay.py re-runs
    those three names' rows, and no other's."""
    before = rc._policy_hashes()
    after = _hashes_after_editing(monkeypatch, "smetric_delay.py")
    changed = {p for p in before if before[p] != after[p]}
    assert changed == {"smetric-delay", "smetric-l3move", "smetric"}


def test_registering_one_more_policy_re_runs_no_others_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """builtin.py imports the policy modules so that they register: a line added there for a
    new policy leaves every other policy's key as it was."""
    before = rc._policy_hashes()
    assert _hashes_after_editing(monkeypatch, "builtin.py") == before


def test_the_headrooms_free_fetches_cost_no_time() -> None:
    """The headroom figure's free tier: a fetch adds nothing to the step that loads it, where
    the study's tier charges its overhead, its link transfer and its PCIe copy."""
    spec = rc.Spec("smetric", 1.5, math.inf, instances=8)
    free = rc._free(spec)
    assert free.key() != spec.key()
    fetch = {}
    for s in (spec, free):
        cfg = rc.sim_config(s)
        engine = Tiers(cfg, rc.timing(s, cfg), s.ratio).engine(0)
        fetch[s.pcie] = engine.storage_fetch_seconds(16_000)
    assert fetch[False] == 0.0
    assert fetch[True] > 1.5e-3  # at least the per-fetch overhead


def test_the_cache_key_names_the_study_window(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = rc.Spec("smetric", 1.5)
    before = spec.key()
    monkeypatch.setattr(rc, "STUDY", dataclasses.replace(rc.STUDY, skip=500))
    assert spec.key() != before
    monkeypatch.setattr(rc, "STUDY", dataclasses.replace(rc.STUDY, extra_args=("--x", "1")))
    assert spec.key() != before


def test_a_warm_start_measures_the_cold_windows_requests_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny_study(monkeypatch, tmp_path, rc.Study(sessions=10, seeds=(1,), min_requests=1))
    lead = 30.0
    cold, warm = rc.trace(1), rc.trace(1, lead)
    assert len(warm) > len(cold)
    spec = rc.Spec("smetric", 1.0, lead_in=lead)
    cfg = rc.sim_config(spec)
    res = Cluster(cfg, make_policy("smetric", cfg.params), spec.ratio).run(warm, spec.stretch())
    kept = rc.measured(res, warm, lead)
    assert len(res.records) == len(warm)
    assert sorted(
        (round(warm[r.trace_index].arrival_s - lead, 3), warm[r.trace_index].input_len)
        for r in kept.records
    ) == sorted((round(c.arrival_s, 3), c.input_len) for c in cold)
    assert rc.measured(res, warm, 0.0) is res
    assert "--lead-in-s 30" in rc.STUDY.command(1, lead)


def test_a_changed_source_file_changes_the_code_version(tmp_path: Path) -> None:
    assert rc._source_hash("sim") == rc._source_hash("sim")
    assert rc._source_hash("sim") != rc._source_hash("engine")


def test_spread_is_the_mean_and_the_range_over_seeds() -> None:
    s = spread([1.0, 1.2, 1.1])
    assert s.mean == pytest.approx(1.1)
    assert (s.lo, s.hi) == (1.0, 1.2)
    assert s.fmt() == "1.100 [1.000–1.200]"
    assert spread([0.5]).pct() == "50.0 %"
    with pytest.raises(ValueError):
        spread([])


def test_per_window_imbalance_is_read_from_the_rows_windows() -> None:
    row = {
        "windows": [[10, 10], [30, 10], [0, 0], [5, 15], [100, 0]],  # the last: the drain
        "arrival_windows": 4,
    }
    assert rc.row_imbalance(row) == pytest.approx([1.0, 1.5, 1.5])
    # minutes of two 30 s windows: (40, 20) -> 1.33, then (5, 15) alone -> 1.5
    assert rc.row_imbalance(row, group=2) == pytest.approx([40 / 30, 1.5])


def test_the_figures_end_to_end_on_a_tiny_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every figure's file from a few hundred requests on two trace seeds: the script runs
    against the simulator's interface (tiers, per-window rows) without failing late."""
    results = tiny_study(
        monkeypatch, tmp_path, rc.Study(sessions=40, limit=60, seeds=(1, 2), min_requests=60)
    )
    monkeypatch.setattr(rc, "SWEEP", (1.0, 2.0))
    monkeypatch.setattr(rc, "AT", 2.0)
    monkeypatch.setattr(rc, "LAMBDAS", (0.5, 0.6))
    monkeypatch.setattr(rc, "MOVE_COSTS", (2.0, math.inf))
    monkeypatch.setattr(rc, "HITS", (0.5,))
    monkeypatch.setattr(rc, "PROVISIONING", (0.0, math.inf))
    monkeypatch.setattr(rc, "NICS", (1,))
    monkeypatch.setattr(rc, "DEGRADED_GBPS", (5.0,))
    monkeypatch.setattr(rc, "HINT_RATES", (2.0,))
    # the scale figure: one trace seed, and a Mooncake-schema file of a few sessions for seed 0
    monkeypatch.setattr(rc, "SCALE_SEEDS", (1,))
    monkeypatch.setattr(rc, "MOONCAKE_SWEEP", (1.0,))
    monkeypatch.setattr(rc, "FU_SWEEPS", {"trace": (1.0,), "on-reply": (1.0,)})
    monkeypatch.setattr(rc, "FINE_SWEEP", (1.0, 1.5))
    monkeypatch.setattr(rc, "KNEE_SWEEP", (1.0, 1.5, 2.0))  # the sweep with a point between its two
    monkeypatch.setattr(rc, "WARM_SWEEP", (1.0,))
    monkeypatch.setattr(rc, "WARM_MOONCAKE_SWEEP", (1.0,))
    monkeypatch.setattr(rc, "WARM_LEAD_S", 2.0)  # of the tiny Mooncake file's 5.5 s
    mooncake = tmp_path / "mooncake.jsonl"
    lines = []
    for i in range(12):  # 4 sessions of 3 turns, each turn extending the last
        s, turn = i % 4, i // 4
        ids = [1000 * s + b for b in range(2 * (turn + 1))]
        lines.append(orjson.dumps({"timestamp": 500 * i, "input_length": 512 * len(ids),
                                   "output_length": 20, "hash_ids": ids}))  # fmt: skip
    mooncake.write_bytes(b"\n".join(lines) + b"\n")
    monkeypatch.setattr(rc, "MOONCAKE_TRACE", mooncake)
    monkeypatch.setattr(rc, "_chosen", [])
    assert rc.main(["all"]) == 0
    for name in rc.FIGS:
        text = (results / f"{name}.md").read_text()
        assert f"python -m benchmarks.repro_colocated {name}" in text
        assert rc.CODE_VERSION["model"] in text
    acc = (results / "acceptance.md").read_text()
    assert "load_balance local hit share, no global tier" in acc
    assert "[" in acc  # two seeds: a range beside the mean
    fine = (results / "fine_sweep.md").read_text()
    assert "| 2 / stretched |" in fine and "| 2 / 2 |" in fine  # every seed, both ways
    warm = (results / "warm_start.md").read_text()
    assert "| seed 2, warm |" in warm and "| Mooncake, 8 instances, cold |" in warm
    rows = [f for f in (tmp_path / "cache").iterdir() if f.suffix == ".json"]
    assert rows
    # rerunning reads the cache: no new run
    before = {f.name: f.stat().st_mtime_ns for f in rows}
    assert rc.main(["fig14"]) == 0
    after = {f.name: f.stat().st_mtime_ns for f in (tmp_path / "cache").iterdir()}
    assert after == before
