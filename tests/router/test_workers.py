"""The registry's pure parts: the load rule, page-size and model discovery, URL checks."""

from __future__ import annotations

import pytest

from smetric_router.router.workers import (
    Role,
    Worker,
    models_of,
    normalize_url,
    page_size_of,
)


def test_load_is_own_inflight_plus_the_foreign_share_of_a_fresh_report() -> None:
    w = Worker("http://w", inflight=3)
    assert w.load(now=100.0, max_age=3.0) == 3.0  # nothing reported yet
    # The worker reports 7 while 3 of ours run: 4 come from other router replicas.
    w.reported_load, w.reported_at, w.own_at_report = 7.0, 99.0, 3
    assert w.load(now=100.0, max_age=3.0) == 7.0
    w.inflight = 5
    assert w.load(now=100.0, max_age=3.0) == 9.0  # our own dispatches since the poll add up
    w.inflight = 0
    assert w.load(now=100.0, max_age=3.0) == 4.0  # ours finished: only the foreign share stays
    w.reported_load = 2.0
    assert w.load(now=100.0, max_age=3.0) == 0.0  # the report never lowers our own count
    w.inflight = 1
    assert w.load(now=110.0, max_age=3.0) == 1.0  # a stale report is ignored


def test_running_is_the_fresh_reported_batch_of_a_colocated_worker() -> None:
    w = Worker("http://w", inflight=3)
    assert w.running(now=100.0, max_age=3.0) is None  # nothing reported yet: unknown, not 0
    w.reported_running, w.reported_at = 2, 99.0
    assert w.running(now=100.0, max_age=3.0) == 2  # the report alone: one of ours is queued
    assert w.running(now=110.0, max_age=3.0) is None  # a stale report is unknown
    p = Worker("http://p", role=Role.PREFILL, reported_running=2, reported_at=99.0)
    assert p.running(now=100.0, max_age=3.0) is None  # PD: the load is tokens


def test_page_size_prefers_the_kv_event_block_size() -> None:
    assert page_size_of({"page_size": 16, "kv_events": {"block_size": 32}}) == 32
    assert page_size_of({"page_size": 16, "kv_events": None}) == 16
    assert page_size_of({}) is None


def test_models_union_of_v1_models_and_model_info() -> None:
    got = models_of({"data": [{"id": "served"}]}, {"model_path": "/m/path", "x": 1})
    assert got == {"served", "/m/path"}
    assert models_of(None, None) == frozenset()


def test_worker_urls_are_normalized_and_checked() -> None:
    assert normalize_url(" http://h:1/ ") == "http://h:1"
    for bad in ("h:1", "ftp://h", "http://"):
        with pytest.raises(ValueError):
            normalize_url(bad)
