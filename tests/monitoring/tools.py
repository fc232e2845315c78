"""deploy/monitoring as the tests read it: the rules, the Grafana dashboard's queries, the metric
names a PromQL expression reads, the names the router exports, and the tools that run them.

- ``SMETRIC_REQUIRE_PROMETHEUS=1`` (what ``make test`` sets): a missing ``promtool`` or
  ``prometheus`` (Debian's ``prometheus`` package) fails the tests instead of skipping them.
- ``SMETRIC_REQUIRE_CHROMIUM=1``: the same for ``chromium`` (Debian's ``chromium``), which the
  /dashboard page's tests open headless. ``make setup`` installs both.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from smetric_router.discovery.metrics import DiscoveryMetrics
from smetric_router.router.metrics import L3Sample, RouterMetrics, WorkerSample

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "deploy" / "monitoring"
RULES = MONITORING / "smetric-rules.yaml"
RULE_TESTS = MONITORING / "smetric-rules.test.yaml"
DASHBOARD = MONITORING / "grafana-dashboard.json"

# Grafana's interval variables, as the tests substitute them (the live test's run is short).
GRAFANA_VARS = {"$__rate_interval": "5s", "$__interval": "1s", "$__range": "1m"}

_PROMQL_WORDS = frozenset({
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "offset", "bool", "inf", "nan",
})  # fmt: skip
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_BRACES = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)(\s*\()?")


def _missing(what: str, env: str) -> None:
    reason = f"{what} (make setup installs it)"
    if os.environ.get(env) == "1":
        pytest.fail(f"{reason}; {env}=1 makes this a failure")
    pytest.skip(reason)


def require_tool(name: str, env: str = "SMETRIC_REQUIRE_PROMETHEUS") -> str:
    path = shutil.which(name)
    if path is None:
        _missing(f"{name} not found", env)
    assert path is not None
    return path


def require_chromium() -> str:
    return require_tool("chromium", "SMETRIC_REQUIRE_CHROMIUM")


def rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(RULES.read_text())["groups"]
    return groups


def rules() -> list[dict[str, Any]]:
    return [r for g in rule_groups() for r in g["rules"]]


def recording_names() -> list[str]:
    return list(dict.fromkeys(r["record"] for r in rules() if "record" in r))


def alert_names() -> list[str]:
    return [r["alert"] for r in rules() if "alert" in r]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panel_queries() -> Iterator[tuple[str, str]]:
    """(panel title, PromQL as Grafana sends it) for every target of every panel."""
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def substitute(expr: str) -> str:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    return expr


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads, found loosely: strings, label matchers, range
    brackets and grouping clauses are taken out, then every identifier that is not a function
    call or a keyword is a metric name."""
    text = _STRING.sub('""', expr)
    text = _BRACES.sub("", text)
    text = _RANGE.sub("", text)
    text = _GROUPING.sub("", text)
    found = set()
    for m in _IDENT.finditer(text):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in _PROMQL_WORDS:
            continue
        found.add(name)
    return found


def exported_names() -> set[str]:
    """Every sample name the router's /metrics can carry: its registry with a worker on a KV
    feed, an L3 view that has asked the master, and discovery, as Prometheus sees them (a
    counter's _total and _created, a histogram's _bucket, _count, _sum and _created)."""
    worker = WorkerSample("http://w:1", True, 1, 1.0, kv_connected=True, inflight_pages=1)
    l3 = L3Sample("master", True, {"hit": 1}, 0, 0, keys=1, pages=1, queries=1)
    metrics = RouterMetrics(lambda: [worker], lambda: l3)
    registry: CollectorRegistry = metrics.registry
    DiscoveryMetrics(registry)
    names: set[str] = set()
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "gauge": ("",),
        "summary": ("", "_count", "_sum", "_created"),
    }
    for family in registry.collect():
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
    return names
