"""The command lines of every rendered manifest pass the parser of the program they run: the
router's own (router/cli.py, flags from RouterConfig), SGLang 0.5.23's ServerArgs (in the CPU
SGLang environment), the emulator's, and mooncake_master's flag list. The SGLang workers get the
arguments the launcher gives them for the same cluster (launch/sglang-h20*.yaml)."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest

from smetric_router.launch import load_spec
from smetric_router.launch.kinds.sglang import mooncake_env, server_args
from smetric_router.router.api_responses import RESPONSE_ID_KEY_ENV
from smetric_router.router.config import ADMIN_API_KEY_ENV, API_KEY_ENV, WORKER_API_KEY_ENV
from tests.deploy.checks import worker_role
from tests.deploy.manifests import (
    DISCOVERY_FLAGS,
    OVERLAYS,
    REPO,
    SAMPLE_POD_IP,
    container_env,
    emulator_error,
    find,
    flag_value,
    of_kind,
    render,
    router_error,
    split_discovery,
    unrecognized,
)
from tests.helpers.server_args import parse_server_args
from tests.sglang_env import require_sglang_python

GPU_OVERLAYS = ("h20", "pd")


def router_args(overlay: str) -> list[str]:
    (router,) = of_kind(render(overlay), "router")
    return list(router.args)


def without_discovery(args: list[str]) -> list[str]:
    """The router's command line as today's parser can read it: discovery flags out, and in PD
    mode one stand-in prefill and decode for the pods discovery would add."""
    rest, _ = split_discovery(args)
    if "--pd-disaggregation" in rest:
        rest += ["--prefill", "http://10.0.0.1:31000", "--decode", "http://10.0.0.2:31000"]
    return rest


# Needs the router's Kubernetes discovery flags (DISCOVERY_FLAGS), which a concurrent branch adds
# to RouterConfig: until it is merged the parser refuses them and this test fails on them alone
# (test_router_flags_besides_discovery_parse shows everything else is accepted).
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_router_command_lines_parse_with_the_routers_parser(overlay: str) -> None:
    assert router_error(router_args(overlay)) is None


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_router_flags_besides_discovery_parse(overlay: str) -> None:
    args = router_args(overlay)
    _, found = split_discovery(args)
    assert {"--service-discovery", "--discovery-provider", "--service-discovery-port",
            "--service-discovery-namespace"} <= set(found)  # fmt: skip
    assert found["--discovery-provider"] == ["kubernetes"]
    assert set(found) <= set(DISCOVERY_FLAGS)
    assert router_error(without_discovery(args)) is None


def test_a_misspelled_router_flag_is_reported() -> None:
    args = router_args("h20")
    assert "--policy=smetric" in args
    wrong = [a.replace("--policy=", "--polcy=") for a in args]
    assert router_error(without_discovery(args)) is None
    assert unrecognized(router_error(without_discovery(wrong))) == ["--polcy=smetric"]
    assert "--polcy=smetric" in unrecognized(router_error(wrong))


def test_router_keys_come_from_the_secret_not_the_command_line() -> None:
    for overlay in OVERLAYS:
        (router,) = of_kind(render(overlay), "router")
        from_secret = {e["name"] for e in router.container["env"]
                       if "secretKeyRef" in e.get("valueFrom", {})}  # fmt: skip
        assert from_secret == {API_KEY_ENV, ADMIN_API_KEY_ENV, WORKER_API_KEY_ENV,
                               RESPONSE_ID_KEY_ENV}  # fmt: skip
        assert not any(a.split("=")[0].endswith("-key") for a in router.args), router.args


def sglang_argvs(overlay: str) -> list[tuple[str, list[str]]]:
    return [(worker_role(p), list(p.args)) for p in of_kind(render(overlay), "sglang")]


@pytest.mark.sglang
def test_sglang_command_lines_parse_with_sglangs_parser() -> None:
    argvs = [(o, role, a) for o in GPU_OVERLAYS for role, a in sglang_argvs(o)]
    assert {(o, role) for o, role, _ in argvs} == {("h20", "null"), ("pd", "prefill"),
                                                   ("pd", "decode")}  # fmt: skip
    results = parse_server_args([a for _, _, a in argvs])
    for (overlay, role, _), r in zip(argvs, results, strict=True):
        assert "error" not in r, (overlay, role, r)
        assert r["page_size"] == 16 and r["enable_cache_report"] and r["port"] == 31000
        assert r["disaggregation_mode"] == role
        if role != "decode":
            kv = json.loads(r["kv_events_config"])
            assert kv["endpoint"] == f"tcp://{SAMPLE_POD_IP}:31001", kv
            assert r["hicache_storage_backend"] == "mooncake"
        if role == "prefill":
            assert r["disaggregation_bootstrap_port"] == 31003


@pytest.mark.sglang
def test_a_misspelled_sglang_flag_is_reported() -> None:
    ((_, args),) = sglang_argvs("h20")
    wrong = [a.replace("--page-size", "--page-sise") for a in args]
    ok, bad = parse_server_args([args, wrong])
    assert "error" not in ok
    assert "unrecognized arguments: --page-sise" in bad["error"]


def _normalized(args: list[str]) -> list[str]:
    """A worker's arguments with what differs by where it runs made equal: the model's folder
    (a hub id for the launcher, a mounted path here) and the KV-event host (a wildcard for the
    launcher, the pod IP here)."""
    out = list(args)
    i = out.index("--model-path") + 1
    out[i] = Path(out[i]).name
    if "--kv-events-config" in out:
        i = out.index("--kv-events-config") + 1
        out[i] = out[i].replace(SAMPLE_POD_IP, "*")
    return out


@pytest.mark.parametrize("overlay", GPU_OVERLAYS)
def test_sglang_arguments_are_the_launchers(overlay: str) -> None:
    spec = load_spec(
        REPO / "launch" / ("sglang-h20.yaml" if overlay == "h20" else "sglang-h20-pd.yaml")
    )
    for p in of_kind(render(overlay), "sglang"):
        role = worker_role(p)
        want = server_args(spec, host="h20-node-1", port=31000, role=role,
                           kv_ports=None if role == "decode" else (31001, 31002),
                           bootstrap_port=31003 if role == "prefill" else None)  # fmt: skip
        assert _normalized(list(p.args)) == _normalized(want), (p.name, role)
        assert spec.mooncake is not None
        env = container_env(p.container)
        for name, value in mooncake_env(spec.mooncake, "h20-node-1").items():
            if name in ("MOONCAKE_MASTER", "MOONCAKE_TE_META_DATA_SERVER",
                        "MOONCAKE_LOCAL_HOSTNAME"):  # fmt: skip
                assert name in env  # in-cluster addresses: tests/deploy/checks.py
            else:
                assert env.get(name) == value, (p.name, name)


def _size_bytes(text: str) -> float:
    units = {"gb": 1e9, "gi": 2**30, "mb": 1e6, "mi": 2**20}
    for unit, factor in units.items():
        if text.lower().endswith(unit):
            return float(text[: -len(unit)]) * factor
    return float(text)


@pytest.mark.parametrize("overlay", GPU_OVERLAYS)
def test_sglang_workers_get_one_gpu_and_room_for_their_mooncake_segment(overlay: str) -> None:
    for p in of_kind(render(overlay), "sglang"):
        res = p.container["resources"]
        assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == 1
        assert flag_value(p.args, "--tp-size") == "1"
        if flag_value(p.args, "--hicache-storage-backend") == "mooncake":
            segment = _size_bytes(container_env(p.container)["MOONCAKE_GLOBAL_SEGMENT_SIZE"])
            assert _size_bytes(res["requests"]["memory"]) > segment, p.name


def test_the_cpu_overlay_has_no_gpu_and_emulated_workers() -> None:
    objs = render("cpu")
    assert "nvidia.com/gpu" not in json.dumps(objs)
    assert not of_kind(objs, "sglang")
    (emulated,) = find(objs, "StatefulSet")
    assert emulated["spec"]["replicas"] == 4


def test_emulator_command_lines_parse_with_the_emulators_parser() -> None:
    objs = render("cpu")
    emulators = of_kind(objs, "emulator")
    assert emulators
    (router,) = of_kind(objs, "router")
    for p in emulators:
        assert emulator_error(list(p.args)) is None, p.args
        kv = json.loads(flag_value(p.args, "--kv-events-config") or "{}")
        assert kv["endpoint"] == f"tcp://{SAMPLE_POD_IP}:31001" and kv["bind"] is True
        # the router renders chats with the template the workers render them with
        assert flag_value(p.args, "--chat-template") == flag_value(router.args, "--chat-template")
    wrong = [a.replace("--page-size", "--page-sise") for a in emulators[0].args]
    assert "unrecognized arguments: --page-sise=16" in (emulator_error(wrong) or "")


@pytest.mark.sglang
def test_mooncake_master_flags_exist() -> None:
    """mooncake_master (gflags) exits on an unknown flag; its --helpfull lists the known ones."""
    binary = require_sglang_python().parent / "mooncake_master"
    if not binary.exists():
        pytest.fail(f"{binary} is missing: make sglang installs Mooncake in .venv-sglang")
    text = subprocess.run([str(binary), "--helpfull"], capture_output=True, text=True,
                          timeout=60, check=False).stdout  # fmt: skip
    for overlay in GPU_OVERLAYS:
        objs = render(overlay)
        (master,) = of_kind(objs, "mooncake-master")
        for arg in master.args:
            name = arg.lstrip("-").partition("=")[0]
            assert f"-{name} (" in text, f"mooncake_master has no --{name}"
        assert f"-{'rpc_portt'} (" not in text  # the check can tell a wrong name
        ports = {p["name"]: p["containerPort"] for p in master.container["ports"]}
        for flag, port in (("--rpc_port", "rpc"), ("--http_metadata_server_port", "metadata"),
                           ("--metrics_port", "metrics")):  # fmt: skip
            assert flag_value(master.args, flag) == str(ports[port])


def test_a_broken_copy_of_a_manifest_is_reported() -> None:
    """The consistency checks see a mismatched port, selector, RBAC subject and grace period."""
    from tests.deploy.checks import (
        check_discovery_port,
        check_rbac,
        check_router_drain,
        check_selectors,
        check_services,
    )

    objs = render("pd")
    assert not any(c(objs) for c in (check_discovery_port, check_rbac, check_router_drain,
                                      check_selectors, check_services))  # fmt: skip
    broken = copy.deepcopy(objs)
    (router,) = find(broken, "Deployment", "smetric-router")
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    args[args.index("role=decode")] = "role=decoder"
    args[args.index("--service-discovery-port=31000")] = "--service-discovery-port=30000"
    router["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 60
    find(broken, "RoleBinding")[0]["subjects"][0]["name"] = "default"
    find(broken, "Service", "mooncake-master")[0]["spec"]["ports"][0]["targetPort"] = "grpc"
    assert any("decode selector" in p for p in check_selectors(broken))
    assert any("discovers on port 30000" in p for p in check_discovery_port(broken))
    assert any("terminationGracePeriodSeconds 60" in p for p in check_router_drain(broken))
    assert any("may only []" in p for p in check_rbac(broken))
    assert any("'grpc'" in p for p in check_services(broken))
