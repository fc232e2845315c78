"""Prometheus text in tests, read with the router's own reader (smetric_router.core.prometheus:
prometheus_client's parser). Each function takes a page's text; strict: a malformed exposition
fails the test that reads it."""

from __future__ import annotations

import urllib.request

from smetric_router.core import prometheus
from smetric_router.core.prometheus import Sample, samples

__all__ = ["Sample", "metric", "samples", "scrape", "total", "value"]


def scrape(base_url: str) -> str:
    """GET base_url/metrics."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as r:
        return str(r.read().decode())


def total(text: str, name: str, **labels: str) -> float:
    """The sum of the samples named `name` (a counter's `_total`, say) whose labels include
    `labels`; 0 when there is none."""
    return prometheus.total(samples(text), name, **labels)


def value(text: str, name: str, **labels: str) -> float | None:
    """The value of the one sample named `name` whose labels include `labels`; None when there
    is none, an AssertionError when several match (more labels tell them apart)."""
    found = [s for s in samples(text) if s.name == name and prometheus.has_labels(s, labels)]
    assert len(found) <= 1, f"{len(found)} samples {name} with {labels}: {found}"
    return found[0].value if found else None


def metric(base_url: str, name: str, **labels: str) -> float:
    """`value` of the sample on base_url's /metrics now; fails when it is not there."""
    found = value(scrape(base_url), name, **labels)
    assert found is not None, f"no {name} {labels or ''} in {base_url}/metrics"
    return found
