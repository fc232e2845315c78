"""benchmarks.slo_rescore: goodput of stored bench_serving results under other SLOs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import slo_rescore as sr


def _result() -> dict[str, object]:
    """Four requests over 2 s: fast, slow to start, slow to decode, failed."""
    return {
        "duration": 2.0,
        "ttfts": [0.1, 9.0, 0.2, 0.0],
        "itls": [[0.02, 0.02], [0.02, 0.02], [0.2, 0.2], []],
        "output_lens": [3, 3, 3, 0],
        "errors": ["", "", "", "boom"],
    }


def test_a_request_counts_only_within_both_slos() -> None:
    goodput, tpot_ok = sr.score(_result(), ttft_ms=8000, tpot_ms=30)
    assert goodput == pytest.approx(1 / 2.0)  # only the first: 20 ms a token, 0.1 s to start
    assert tpot_ok == pytest.approx(2 / 4)  # the first two decode in time; the failed one not
    goodput, tpot_ok = sr.score(_result(), ttft_ms=8000, tpot_ms=400)
    assert goodput == pytest.approx(2 / 2.0)  # the slow decode passes a loose TPOT SLO
    assert tpot_ok == pytest.approx(3 / 4)


def test_the_table_reads_a_compare_work_dir(tmp_path: Path) -> None:
    for draw, slug in ((1, "smetric_1_5"), (2, "smetric_1_5_d2")):
        side = {"router": "smetric", "rate": 1.5, "draw": draw}
        (tmp_path / f"{slug}.run.json").write_text(json.dumps(side))
        (tmp_path / f"{slug}.jsonl").write_text(json.dumps(_result()) + "\n")
    lines = sr.table(tmp_path, 8000, [30, 400])
    assert lines[2].startswith("| smetric | 1.5 | 2 | 0.50 [0.50–0.50] | 50.0 % [50.0–50.0]")
    assert "1.00 [1.00–1.00]" in lines[2]


def test_an_empty_dir_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"no benchmarks\.compare runs"):
        sr.table(tmp_path, 8000, [30])
