"""deploy/monitoring's rules and dashboard, checked without a server: promtool accepts the rules
and passes their unit tests, the unit tests leave no alert or recording rule out, and every
metric the rules and the dashboard's queries read is one the router exports (or a recording rule
of the file)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from tests.monitoring.tools import (
    DASHBOARD,
    MONITORING,
    RULE_TESTS,
    RULES,
    alert_names,
    dashboard,
    exported_names,
    metric_names,
    panel_queries,
    recording_names,
    require_tool,
    rules,
)


def _promtool(*args: str, cwd: Path = MONITORING) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require_tool("promtool"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def test_promtool_checks_the_rules() -> None:
    done = _promtool("check", "rules", RULES.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


def test_promtool_unit_tests_pass() -> None:
    done = _promtool("test", "rules", RULE_TESTS.name)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_wrong_expectation_fails_the_unit_tests(tmp_path: Path) -> None:
    shutil.copy(RULES, tmp_path / RULES.name)
    text = RULE_TESTS.read_text().replace("value: 0.6\n", "value: 0.7\n", 1)
    (tmp_path / "broken.test.yaml").write_text(text)
    done = _promtool("test", "rules", "broken.test.yaml", cwd=tmp_path)
    assert done.returncode != 0
    assert "smetric:sticky_share:ratio_rate5m" in done.stdout + done.stderr


def test_every_alert_is_tested_firing_and_quiet() -> None:
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fires: set[str] = set()
    quiet: set[str] = set()
    for case in cases:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    alerts = set(alert_names())
    assert alerts - fires == set(), "alerts no test makes fire"
    assert alerts - quiet == set(), "alerts no test shows quiet"
    assert (fires | quiet) <= alerts, "tests of alerts that do not exist"


def test_every_recording_rule_has_its_value_tested() -> None:
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    tested = {c["expr"] for case in cases for c in case.get("promql_expr_test", [])
              if c["exp_samples"]}  # fmt: skip
    assert set(recording_names()) - tested == set()


def test_every_alert_says_what_to_do() -> None:
    for rule in rules():
        if "alert" in rule:
            notes = rule.get("annotations", {})
            assert {"summary", "description", "runbook"} <= notes.keys(), rule["alert"]
            assert f"docs/observing.md#{rule['alert'].lower()}" in notes["runbook"]
            assert rule["labels"]["severity"] in ("info", "warning", "critical")


def test_the_rules_read_only_metrics_the_router_exports() -> None:
    known = exported_names() | set(recording_names())
    for rule in rules():
        unknown = metric_names(rule["expr"]) - known
        assert not unknown, f"{rule.get('record') or rule.get('alert')}: {unknown}"


def test_the_dashboard_reads_only_metrics_the_router_exports() -> None:
    known = exported_names() | set(recording_names())
    queries = list(panel_queries())
    assert queries
    for title, expr in queries:
        unknown = metric_names(expr) - known
        assert not unknown, f"panel {title!r}: {unknown}"


def test_the_name_check_catches_a_misspelled_metric() -> None:
    assert metric_names('sum by (reason) (rate(smetric_decision_total{reason="x"}[5m]))') == {
        "smetric_decision_total"
    }
    assert "smetric_decision_total" not in exported_names()


def test_the_dashboard_is_importable() -> None:
    d = dashboard()
    assert d["schemaVersion"] >= 39  # Grafana 11 and later
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for panel in d["panels"]:
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
    kinds = {p["type"] for p in d["panels"]}
    assert "heatmap" in kinds
    heatmap = next(p for p in d["panels"] if p["type"] == "heatmap")
    assert [t["expr"] for t in heatmap["targets"]] == ["smetric_worker_load"]
    assert DASHBOARD.read_text().endswith("\n")
