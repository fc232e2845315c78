"""The Prometheus text reader (core/prometheus.py) on what prometheus_client writes: label
values with quotes, backslashes and newlines, histograms; the lenient reader skips junk lines."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from smetric_router.core.prometheus import Sample, readable_samples, samples, total


def exposition() -> str:
    registry = CollectorRegistry()
    c = Counter("smetric_t_requests", "requests", ["worker", "reason"], registry=registry)
    c.labels("http://a:1", "sticky").inc(2)
    c.labels("http://a:1", "first-turn-balance").inc()
    c.labels('odd "quoted" \\ {worker="x"}\nline', "sticky").inc(5)
    Gauge("smetric_t_known", "known", registry=registry).set(math.inf)
    Histogram("smetric_t_seconds", "seconds", registry=registry, buckets=(0.1, 1.0)).observe(0.5)
    return generate_latest(registry).decode()


def named(found: list[Sample]) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for s in found]


def test_strict_and_line_by_line_read_the_same_samples() -> None:
    text = exposition()
    assert named(samples(text)) == named(readable_samples(text))
    found = samples(text)
    odd = 'odd "quoted" \\ {worker="x"}\nline'
    assert total(found, "smetric_t_requests_total", worker=odd) == 5
    assert total(found, "smetric_t_requests_total", worker="http://a:1") == 3
    assert total(found, "smetric_t_requests_total", reason="sticky") == 7
    assert total(found, "smetric_t_requests_total", reason="none") == 0
    assert total(found, "smetric_t_known") == math.inf
    assert total(found, "smetric_t_seconds_bucket", le="1.0") == 1


def test_junk_is_an_error_strictly_and_skipped_line_by_line() -> None:
    text = exposition()
    junk = "not a sample\n" + text + 'smetric_t_known{unterminated="1\n\x00\xff\n'
    with pytest.raises(ValueError):
        samples(junk)
    assert named(readable_samples(junk)) == named(samples(text))
    assert readable_samples("") == [] and readable_samples("# only a comment\n\n") == []
