"""The simulator study (benchmarks/repro_colocated.py) pointed at a temporary folder and a tiny
generated trace, for the tests that run its figures end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import repro_colocated as rc


def tiny_study(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, study: rc.Study) -> Path:
    """Work, cache and results under tmp_path, the study's traces generated afresh there; the
    results folder."""
    monkeypatch.setattr(rc, "WORK", tmp_path)
    monkeypatch.setattr(rc, "CACHE", tmp_path / "cache")
    results = tmp_path / "results"
    results.mkdir()
    monkeypatch.setattr(rc, "RESULTS", results)
    monkeypatch.setattr(rc, "STUDY", study)
    monkeypatch.setattr(rc, "SEEDS", study.seeds)
    monkeypatch.setattr(rc, "_traces", {})
    return results
