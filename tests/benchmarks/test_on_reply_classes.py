"""benchmarks/on_reply_classes.py: each request's class is what the router saw when it placed it,
the recorder decides as the policy it wraps, and the report end to end on a tiny trace."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks import on_reply_classes as orc
from benchmarks import repro_colocated as rc
from smetric_router.core.types import ClusterView, RequestFeatures, WorkerView
from smetric_router.policies import make_policy
from smetric_router.policies.base import PolicyParams
from smetric_router.sim.cluster import RequestRecord
from smetric_router.sim.config import Slo
from tests.helpers.study import tiny_study

HISTORY = 1000


def _features(turn: int, est_hit: int = HISTORY) -> RequestFeatures:
    return RequestFeatures(prompt_len=1200, page_hashes=[], page_size=16, turn=turn,
                           est_hit=est_hit)  # fmt: skip


def _view(*hits: tuple[int, int | None], load: float = 2.0) -> ClusterView:
    workers = tuple(
        WorkerView(url=f"w{i}", load=load, hit=hit, l3_hit=l3) for i, (hit, l3) in enumerate(hits)
    )
    return ClusterView(workers, 0)


@pytest.mark.parametrize(
    ("features", "view", "expected"),
    [
        (_features(0, 0), _view((800, 800)), "first turn"),
        (_features(3, 0), _view((0, 0)), "first turn"),  # no countable history
        (_features(3), _view((0, 0), (600, 600)), "follow-up, held"),
        (_features(3), _view((500, 1000), (100, 1000)), "follow-up, in the global tier only"),
        (_features(3), _view((500, 500), (0, None)), "follow-up, held nowhere"),
    ],
)
def test_a_request_is_classed_by_what_the_router_saw(
    features: RequestFeatures, view: ClusterView, expected: str
) -> None:
    assert orc.classify(features, view, hit_ratio=0.5) == expected


def test_the_recorder_decides_as_the_policy_it_wraps() -> None:
    inner = make_policy("lmetric", PolicyParams())
    rec = orc.Recorder(inner, 0.5)
    view = ClusterView(
        (WorkerView(url="a", load=3.0, running=3, hit=900, l3_hit=0),
         WorkerView(url="b", load=1.0, running=1, hit=0, l3_hit=0)),
        0,
    )  # fmt: skip
    feats = _features(2)
    assert rec.decide(feats, view) == inner.decide(feats, view)
    assert rec.name == "lmetric"
    assert rec.classes == ["follow-up, held"]
    assert rec.loads == [2.0]


def _record(instance: int, wait: float, input_len: int = 1000, turn: int = 1) -> RequestRecord:
    return RequestRecord(arrival=10.0, input_len=input_len, output_len=8, turn=turn,
                         instance=instance, first_instance=0, first_token=10.0 + wait,
                         finish=20.0 + wait)  # fmt: skip


def test_class_rows_count_wait_and_slo_per_class() -> None:
    slo = Slo(ttft_base_s=2.0, ttft_per_token_ms=0.0)
    records = [_record(0, 1.0), _record(0, 3.0), _record(1, 0.5, turn=0)]
    classes = ["follow-up, held", "follow-up, held", "first turn"]
    rows = orc.class_rows(records, classes, [1.0, 3.0, 2.0], slo)
    held = rows["follow-up, held"]
    assert (held["n"], held["ok"], held["load"]) == (2.0, 0.5, 2.0)
    assert held["p50"] == pytest.approx(2.0)
    assert rows["first turn"]["ok"] == 1.0
    assert rows["follow-up, held nowhere"]["n"] == 0.0
    assert math.isnan(rows["follow-up, held nowhere"]["p90"])


def test_the_worst_instance_share_of_slow_requests() -> None:
    records = [_record(0, 1.0), _record(1, 40.0), _record(1, 1.0), _record(1, 31.0)]
    assert orc.worst_slow_share(records, 3) == pytest.approx(2 / 3)
    unanswered = RequestRecord(arrival=0.0, input_len=10, output_len=1, turn=0, instance=0,
                               first_instance=0)  # fmt: skip
    assert orc.worst_slow_share([unanswered], 1) == 1.0  # never answered counts as slow


def cells(line: str) -> list[str]:
    """A Markdown table row's cells."""
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_the_report_end_to_end_on_a_tiny_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tiny_study(
        monkeypatch, tmp_path, rc.Study(sessions=20, limit=60, seeds=(1, 2), min_requests=40)
    )
    monkeypatch.setattr(orc, "RATES", (1.0,))
    monkeypatch.setattr(orc, "POLICIES", ("smetric", "lmetric"))
    monkeypatch.setattr(orc, "CAPS", (4,))
    with pytest.raises(SystemExit, match="not cached"):
        orc.main(["--report-only"])
    orc.main([])
    text = (results / "on-reply-classes.md").read_text()
    assert "| 1x | lmetric | follow-up, held |" in text
    head = next(x for x in text.splitlines() if x.startswith("| rate | policy | TPS"))
    capped = next(
        x for x in text.splitlines() if x.startswith("| 1x | smetric + admission cap 4 | ")
    )
    column = dict(zip(cells(head), cells(capped), strict=True))
    assert float(column["longest wait at the router (s)"].split()[0]) > 0  # someone waited
    assert column["refused (429 after the queue timeout)"].endswith("]")
    assert len(list((tmp_path / "cache").glob("*-classes.json"))) == 6
    orc.main(["--report-only"])  # every run now cached
