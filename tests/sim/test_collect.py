"""The simulator makes cyclic GC rare while it runs and gives the interpreter's thresholds back."""

from __future__ import annotations

import gc
import math
from collections.abc import Iterator

import pytest

from smetric_router.core.types import ClusterView, Decision, RequestFeatures
from smetric_router.policies import make_policy
from smetric_router.sim.cluster import Cluster
from smetric_router.sim.collect import rare_collections
from smetric_router.sim.config import SimConfig
from smetric_router.sim.pd import PdCluster
from smetric_router.traces.schema import TraceRequest


@pytest.fixture(autouse=True)
def default_thresholds() -> Iterator[tuple[int, int, int]]:
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield gc.get_threshold()
    gc.set_threshold(*saved)


class _Spy:
    """load_balance, noting the young-generation threshold at each decision."""

    name = "spy"
    uses_text_tree = False

    def __init__(self) -> None:
        self.inner = make_policy("load_balance")
        self.seen: list[int] = []

    def needs_l3(self, features: RequestFeatures, view: ClusterView) -> bool:
        return False

    def decide(self, features: RequestFeatures, view: ClusterView) -> Decision:
        self.seen.append(gc.get_threshold()[0])
        return self.inner.decide(features, view)


def _trace() -> list[TraceRequest]:
    return [
        TraceRequest(f"r{i}", i * 0.1, f"s{i}", None, 0, 64, 4, (i, i + 100, i + 200, i + 300), 16)
        for i in range(4)
    ]


@pytest.mark.parametrize("cluster", [Cluster, PdCluster])
def test_a_run_collects_rarely_and_restores_the_thresholds(
    cluster: type[Cluster] | type[PdCluster], default_thresholds: tuple[int, int, int]
) -> None:
    cfg = SimConfig(instances=2, gpu_kv_tokens=1 << 12, host_kv_tokens=0)
    spy = _Spy()
    cluster(cfg, spy, math.inf).run(_trace())
    assert len(spy.seen) == 4
    assert all(t > default_thresholds[0] for t in spy.seen)
    assert gc.get_threshold() == default_thresholds


def test_the_thresholds_come_back_when_a_run_fails(
    default_thresholds: tuple[int, int, int],
) -> None:
    with pytest.raises(RuntimeError), rare_collections():
        assert gc.get_threshold()[0] > default_thresholds[0]
        raise RuntimeError("a run failed")
    assert gc.get_threshold() == default_thresholds
