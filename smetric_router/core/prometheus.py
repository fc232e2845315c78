"""Prometheus text exposition read with prometheus_client's own parser, the library that writes
the router's /metrics: label quoting and escapes, NaN and infinities, timestamps are its business,
not a regex's.

`samples` reads an exposition strictly (a malformed one is a ValueError): for pages whose format
is a contract. `readable_samples` reads another program's page a line at a time and skips the
lines the parser refuses, so that junk in it costs only those lines: the router's view of the
Mooncake master must not fail on a master that writes one odd line.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

__all__ = ["Sample", "has_labels", "readable_samples", "samples", "total"]


def samples(text: str) -> list[Sample]:
    """Every sample of the exposition `text` (name, labels, value, ...), in order, named as the
    parser names them: a counter's samples end in `_total` (one written without it gets it).
    ValueError when `text` is malformed."""
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def readable_samples(text: str) -> list[Sample]:
    """The samples of the lines of `text` that the parser accepts, each line read on its own
    (a sample is one line; comments and blank lines are skipped, so names are as written);
    never raises on content."""
    out: list[Sample] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            out += samples(stripped)
        except ValueError:
            continue
    return out


def total(found: Iterable[Sample], name: str, **labels: str) -> float:
    """The sum of the samples named `name` whose labels include `labels`; 0.0 when none does."""
    return sum((s.value for s in found if s.name == name and has_labels(s, labels)), 0.0)


def has_labels(sample: Sample, labels: dict[str, str]) -> bool:
    """Whether `sample` carries each of `labels` with that value (it may carry more)."""
    return all(sample.labels.get(k) == v for k, v in labels.items())
