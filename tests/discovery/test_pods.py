"""The pod -> worker decision and the pod table, directly: a pod's life (Pending, Running,
Ready, NotReady, deleted), a new IP, labels that stop matching, PD roles, and selectors."""

from __future__ import annotations

import pytest

from smetric_router.discovery.base import Added, Change, Removed
from smetric_router.discovery.pods import Eligible, Ineligible, PodRules, PodTable, decide
from smetric_router.discovery.selectors import SelectorError, parse_selector
from smetric_router.router.workers import Role
from tests.helpers.kube_api import make_pod

RULES = PodRules(port=8000, selector=parse_selector(["app=sglang"]))
PD = PodRules(
    port=8000,
    selector=parse_selector(["app=sglang"]),
    prefill=parse_selector(["role=prefill"], "--prefill-selector"),
    decode=parse_selector(["role=decode"], "--decode-selector"),
)
APP = {"app": "sglang"}


def summary(changes: list[Change]) -> list[tuple[str, str, str]]:
    return [("+" if isinstance(c, Added) else "-", c.worker.url, c.reason) for c in changes]


def test_a_pod_is_a_worker_only_running_ready_and_with_an_ip() -> None:
    assert decide(make_pod("ns", "a", APP, phase="Pending", ready=False), RULES) == Ineligible(
        "not_running"
    )
    assert decide(make_pod("ns", "a", APP, ip="10.0.0.1", ready=False), RULES) == Ineligible(
        "not_ready"
    )
    assert decide(make_pod("ns", "a", APP, ip=None), RULES) == Ineligible("no_ip")
    assert decide(make_pod("ns", "a", {"app": "other"}, ip="10.0.0.1"), RULES) == Ineligible(
        "not_selected"
    )
    d = decide(make_pod("ns", "a", {**APP, "extra": "x"}, ip="10.0.0.1"), RULES)
    assert isinstance(d, Eligible)
    assert d.worker.url == "http://10.0.0.1:8000"
    assert d.worker.spec.role is Role.WORKER
    assert d.worker.source == "pod ns/a"


def test_terminating_pods_and_ipv6() -> None:
    pod = make_pod("ns", "a", APP, ip="10.0.0.1")
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert decide(pod, RULES) == Ineligible("terminating")
    d = decide(make_pod("ns", "a", APP, ip="fd00::5"), RULES)
    assert isinstance(d, Eligible) and d.worker.url == "http://[fd00::5]:8000"


def test_life_of_a_pod() -> None:
    t = PodTable(RULES)
    assert t.apply("ADDED", make_pod("ns", "a", APP, phase="Pending", ready=False)) == []
    assert t.apply("MODIFIED", make_pod("ns", "a", APP, ip="10.0.0.1", ready=False)) == []
    assert summary(t.apply("MODIFIED", make_pod("ns", "a", APP, ip="10.0.0.1"))) == [
        ("+", "http://10.0.0.1:8000", "pod_ready")
    ]
    # a repeated state changes nothing
    assert t.apply("MODIFIED", make_pod("ns", "a", APP, ip="10.0.0.1")) == []
    assert summary(t.apply("MODIFIED", make_pod("ns", "a", APP, ip="10.0.0.1", ready=False))) == [
        ("-", "http://10.0.0.1:8000", "not_ready")
    ]
    t.apply("MODIFIED", make_pod("ns", "a", APP, ip="10.0.0.1"))
    assert summary(t.apply("DELETED", make_pod("ns", "a", APP, ip="10.0.0.1"))) == [
        ("-", "http://10.0.0.1:8000", "deleted")
    ]
    assert t.wanted() == {}


def test_new_ip_is_a_new_worker_old_one_removed_first() -> None:
    t = PodTable(RULES)
    t.apply("ADDED", make_pod("ns", "a", APP, ip="10.0.0.1"))
    assert summary(t.apply("MODIFIED", make_pod("ns", "a", APP, ip="10.0.0.2"))) == [
        ("-", "http://10.0.0.1:8000", "ip_changed"),
        ("+", "http://10.0.0.2:8000", "pod_ready"),
    ]


def test_labels_that_stop_matching_remove_the_worker() -> None:
    t = PodTable(RULES)
    t.apply("ADDED", make_pod("ns", "a", APP, ip="10.0.0.1"))
    assert summary(t.apply("MODIFIED", make_pod("ns", "a", {"app": "x"}, ip="10.0.0.1"))) == [
        ("-", "http://10.0.0.1:8000", "not_selected")
    ]


def test_relist_removes_pods_gone_meanwhile_and_adds_new_ones() -> None:
    t = PodTable(RULES)
    t.apply("ADDED", make_pod("ns", "a", APP, ip="10.0.0.1"))
    t.apply("ADDED", make_pod("ns", "b", APP, ip="10.0.0.2"))
    changes = t.replace(
        [make_pod("ns", "b", APP, ip="10.0.0.2"), make_pod("ns", "c", APP, ip="10.0.0.3")]
    )
    assert summary(changes) == [
        ("-", "http://10.0.0.1:8000", "resync"),
        ("+", "http://10.0.0.3:8000", "pod_ready"),
    ]


def test_two_pods_on_one_address_keep_it_until_both_leave() -> None:
    t = PodTable(RULES)
    t.apply("ADDED", make_pod("ns", "a", APP, ip="10.0.0.1"))
    assert t.apply("ADDED", make_pod("ns", "b", APP, ip="10.0.0.1")) == []
    assert t.apply("DELETED", make_pod("ns", "a", APP, ip="10.0.0.1")) == []
    assert [c.reason for c in t.apply("DELETED", make_pod("ns", "b", APP))] == ["deleted"]


def test_pd_roles_from_selectors_and_bootstrap_annotation() -> None:
    prefill = {**APP, "role": "prefill"}
    d = decide(make_pod("ns", "p", prefill, ip="10.0.0.1"), PD)
    assert isinstance(d, Eligible)
    assert d.worker.spec.role is Role.PREFILL and d.worker.spec.bootstrap_port is None
    annotated = {"sglang.ai/bootstrap-port": "8998"}
    d = decide(make_pod("ns", "p", prefill, ip="10.0.0.1", annotations=annotated), PD)
    assert isinstance(d, Eligible) and d.worker.spec.bootstrap_port == 8998
    bad = {"sglang.ai/bootstrap-port": "port"}
    assert decide(make_pod("ns", "p", prefill, ip="10.0.0.1", annotations=bad), PD) == Ineligible(
        "bad_bootstrap_annotation"
    )
    d = decide(make_pod("ns", "d", {**APP, "role": "decode"}, ip="10.0.0.2"), PD)
    assert isinstance(d, Eligible) and d.worker.spec.role is Role.DECODE
    # the annotation is a prefill's alone
    d = decide(
        make_pod("ns", "d", {**APP, "role": "decode"}, ip="10.0.0.2", annotations=annotated), PD
    )
    assert isinstance(d, Eligible) and d.worker.spec.bootstrap_port is None
    assert decide(make_pod("ns", "x", APP, ip="10.0.0.3"), PD) == Ineligible("not_selected")
    both = PodRules(
        port=1, prefill=parse_selector(["app=sglang"]), decode=parse_selector(["app=sglang"])
    )
    assert decide(make_pod("ns", "x", APP, ip="10.0.0.3"), both) == Ineligible("role_ambiguous")


def test_a_relabelled_pod_changes_role_through_removal() -> None:
    t = PodTable(PD)
    t.apply("ADDED", make_pod("ns", "p", {**APP, "role": "prefill"}, ip="10.0.0.1"))
    changes = t.apply("MODIFIED", make_pod("ns", "p", {**APP, "role": "decode"}, ip="10.0.0.1"))
    assert summary(changes) == [
        ("-", "http://10.0.0.1:8000", "role_changed"),
        ("+", "http://10.0.0.1:8000", "pod_ready"),
    ]
    assert isinstance(changes[1], Added) and changes[1].worker.spec.role is Role.DECODE
    assert isinstance(changes[0], Removed)


def test_selectors_parse_strictly() -> None:
    s = parse_selector(["app=sglang", "tier=a,example.com/zone=z1"])
    assert s.query() == "app=sglang,example.com/zone=z1,tier=a"
    assert s.matches({"app": "sglang", "tier": "a", "example.com/zone": "z1", "x": "y"})
    assert not s.matches({"app": "sglang", "tier": "a"})
    for bad in ("app", "app==x", "app!=x", "=x", "app=x y", "-app=x", "app in (a,b)"):
        with pytest.raises(SelectorError, match="--selector"):
            parse_selector([bad])
    with pytest.raises(SelectorError, match="given twice"):
        parse_selector(["app=a", "app=b"])
