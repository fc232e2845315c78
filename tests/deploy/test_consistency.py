"""The objects of each overlay agree with each other (tests/deploy/checks.py): router selectors
select the worker pods of each role, Services and probes use declared ports, the discovery port
is the workers' HTTP port, KV events are bound on the pod IP, the router's account may watch
pods, the router drains before the kubelet kills it, and the monitors point at real ports."""

from __future__ import annotations

import copy

import pytest

from tests.deploy.checks import (
    ALL_CHECKS,
    check_monitors,
    check_mooncake_env,
    check_probes,
    check_worker_ports,
)
from tests.deploy.manifests import COMPONENTS, OVERLAYS, find, render, template


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_passes(overlay: str, check: object) -> None:
    assert callable(check)
    assert check(render(overlay, COMPONENTS)) == []


def test_the_checks_report_broken_ports_probes_and_monitors() -> None:
    objs = render("pd", COMPONENTS)
    broken = copy.deepcopy(objs)
    (prefill,) = find(broken, "StatefulSet", "sglang-worker-prefill")
    pod = template(prefill)
    pod["metadata"]["annotations"]["sglang.ai/bootstrap-port"] = "8998"
    sglang = pod["spec"]["containers"][0]
    sglang["readinessProbe"]["httpGet"]["port"] = "metrics"
    i = sglang["args"].index("--kv-events-config") + 1
    sglang["args"][i] = sglang["args"][i].replace("$(POD_IP)", "*")
    env = {e["name"]: e for e in sglang["env"]}
    env["MOONCAKE_MASTER"]["value"] = "mooncake-master:50052"
    (mon,) = find(broken, "ServiceMonitor")
    mon["spec"]["endpoints"][0]["port"] = "metrics"
    ports = "\n".join(check_worker_ports(broken))
    assert "bootstrap port 31003, announced 8998" in ports
    assert "not bound on the pod IP" in ports
    assert "readinessProbe port 'metrics' is not declared" in "\n".join(check_probes(broken))
    assert any("50052" in p for p in check_mooncake_env(broken))
    assert any("ServiceMonitor smetric-router" in p for p in check_monitors(broken))
