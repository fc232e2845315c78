"""Read Prometheus text exposition with prometheus_client's own parser (tests' helper)."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(base_url: str) -> str:
    """GET base_url/metrics."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as r:
        return str(r.read().decode())


def sample_sum(text: str, name: str, **labels: str) -> float:
    """The sum of the samples named `name` (a counter's `_total`, say) whose labels include
    `labels`; 0 when there is none."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total
