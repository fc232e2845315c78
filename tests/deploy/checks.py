"""Agreement between the objects of one rendered overlay: each check returns what it finds wrong
(empty when all is well), so a test asserts both that the committed manifests pass and that a
broken object is reported."""

from __future__ import annotations

import json
from collections.abc import Sequence
from urllib.parse import urlparse

from tests.deploy.manifests import (
    Obj,
    Process,
    container_env,
    declared_ports,
    find,
    flag_value,
    iter_probes,
    matches,
    of_kind,
    pod_labels,
    processes,
    selector,
    split_discovery,
    template,
    workloads,
)

WORKER_KINDS = ("sglang", "emulator")


def worker_role(p: Process) -> str:
    """null (colocated), prefill or decode, from the worker's own command line."""
    if p.kind == "sglang":
        return flag_value(p.args, "--disaggregation-mode") or "null"
    return flag_value(p.args, "--role") or flag_value(p.args, "--disaggregation-mode") or "null"


def workers(objs: Sequence[Obj]) -> list[Process]:
    return [p for p in processes(objs) if p.kind in WORKER_KINDS]


def router_selectors(args: Sequence[str]) -> dict[str, dict[str, str]]:
    """The router's selectors by the worker role they find (null, prefill, decode)."""
    _, found = split_discovery(args)
    roles = {"--selector": "null", "--prefill-selector": "prefill", "--decode-selector": "decode"}
    return {role: selector(found[flag]) for flag, role in roles.items() if flag in found}


def check_selectors(objs: Sequence[Obj]) -> list[str]:
    """Each router selector selects exactly the worker pods of its role, and nothing else."""
    problems = []
    for router in of_kind(objs, "router"):
        selectors = router_selectors(router.args)
        pd = "--pd-disaggregation" in router.args
        wanted = {"prefill", "decode"} if pd else {"null"}
        if set(selectors) != wanted:
            problems.append(f"{router.name}: selectors for {sorted(selectors)}, want {wanted}")
        for role, sel in selectors.items():
            chosen = {w["metadata"]["name"] for w in workloads(objs)
                      if matches(sel, pod_labels(w))}  # fmt: skip
            of_role = {p.workload["metadata"]["name"] for p in workers(objs)
                       if worker_role(p) == role}  # fmt: skip
            if not of_role or chosen != of_role:
                problems.append(f"{router.name}: {role} selector {sel} selects {sorted(chosen)}, "
                                f"the {role} workers are {sorted(of_role)}")  # fmt: skip
    return problems


def check_discovery_port(objs: Sequence[Obj]) -> list[str]:
    """The port the router reaches discovered pods on is each worker's HTTP port, declared and
    listened on."""
    problems = []
    for router in of_kind(objs, "router"):
        _, found = split_discovery(router.args)
        port = int(found.get("--service-discovery-port", ["0"])[0])
        for w in workers(objs):
            listens = int(flag_value(w.args, "--port") or 0)
            http = declared_ports(w.container).get("http")
            if not port == listens == http:
                problems.append(f"{router.name} discovers on port {port}; {w.name} listens on "
                                f"{listens}, declares http={http}")  # fmt: skip
        namespace = found.get("--service-discovery-namespace", [""])[0]
        if namespace != router.workload["metadata"].get("namespace"):
            problems.append(f"{router.name} watches namespace {namespace!r}, not its own")
    return problems


def check_services(objs: Sequence[Obj]) -> list[str]:
    """Every Service selects pods, and its targetPort is a port each of them declares."""
    problems = []
    for svc in find(objs, "Service"):
        name, sel = svc["metadata"]["name"], svc["spec"].get("selector", {})
        pods = [w for w in workloads(objs) if matches(sel, pod_labels(w))]
        if not pods:
            problems.append(f"Service {name} selects no pod ({sel})")
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            for w in pods:
                containers = template(w)["spec"]["containers"]
                if not any(target in declared_ports(c) for c in containers):
                    problems.append(f"Service {name} targets port {target!r}, which "
                                    f"{w['metadata']['name']} does not declare")  # fmt: skip
    return problems


def check_probes(objs: Sequence[Obj]) -> list[str]:
    """Probes hit declared ports, on the paths each program serves."""
    paths = {"router": {"readinessProbe": "/readiness", "livenessProbe": "/health"},
             "sglang": dict.fromkeys(("startupProbe", "readinessProbe", "livenessProbe"),
                                     "/health"),
             "emulator": dict.fromkeys(("startupProbe", "readinessProbe", "livenessProbe"),
                                       "/health")}  # fmt: skip
    problems = []
    for p in processes(objs):
        ports = declared_ports(p.container)
        probes = dict(iter_probes(p.container))
        for kind, path in paths.get(p.kind, {}).items():
            got = probes.get(kind, {}).get("httpGet", {}).get("path")
            if got != path:
                problems.append(f"{p.name}: {kind} path {got!r}, want {path!r}")
        for kind, probe in probes.items():
            action = probe.get("httpGet") or probe.get("tcpSocket") or {}
            if action.get("port") not in ports:
                problems.append(f"{p.name}: {kind} port {action.get('port')!r} is not declared")
    return problems


def _endpoint_port(url: str) -> int:
    port = urlparse(url).port
    assert port is not None, url
    return port


def check_worker_ports(objs: Sequence[Obj]) -> list[str]:
    """The ports a worker declares are the ones its command line binds, its KV events on the pod's
    own IP, and a prefill's bootstrap port is the one its pod announces."""
    problems = []
    for w in workers(objs):
        ports = declared_ports(w.container)
        config = flag_value(w.args, "--kv-events-config")
        if worker_role(w) != "decode":
            if config is None:
                problems.append(f"{w.name}: no --kv-events-config")
                continue
            kv = json.loads(config)
            events, replay = kv["endpoint"], kv["replay_endpoint"]
            pod_ip = f"tcp://{container_env(w.container).get('POD_IP')}:"
            if not (events.startswith(pod_ip) and replay.startswith(pod_ip) and kv["bind"]):
                problems.append(f"{w.name}: KV events not bound on the pod IP: {config}")
            if (_endpoint_port(events), _endpoint_port(replay)) != (
                ports.get("kv-events"), ports.get("kv-replay")):  # fmt: skip
                problems.append(f"{w.name}: KV event ports {config} are not the declared "
                                f"kv-events/kv-replay ports")  # fmt: skip
        if worker_role(w) == "prefill":
            boot = flag_value(w.args, "--disaggregation-bootstrap-port")
            annotations = template(w.workload)["metadata"].get("annotations", {})
            announced = annotations.get("sglang.ai/bootstrap-port")
            if not (boot and boot == announced and int(boot) == ports.get("bootstrap")):
                problems.append(f"{w.name}: bootstrap port {boot}, announced {announced}, "
                                f"declared {ports.get('bootstrap')}")  # fmt: skip
    return problems


def check_rbac(objs: Sequence[Obj]) -> list[str]:
    """The router's ServiceAccount is bound to a Role that may get, list and watch pods."""
    problems = []
    for router in of_kind(objs, "router"):
        spec = template(router.workload)["spec"]
        account = spec.get("serviceAccountName")
        namespace = router.workload["metadata"].get("namespace")
        if not find(objs, "ServiceAccount", account):
            problems.append(f"{router.name}: ServiceAccount {account!r} is not in the render")
        verbs: set[str] = set()
        for binding in find(objs, "RoleBinding"):
            subjects = binding.get("subjects", [])
            ours = ("ServiceAccount", account, namespace)
            if not any((s["kind"], s["name"], s.get("namespace")) == ours for s in subjects):
                continue
            ref = binding["roleRef"]
            for role in find(objs, ref["kind"], ref["name"]):
                for rule in role["rules"]:
                    if "" in rule["apiGroups"] and "pods" in rule["resources"]:
                        verbs |= set(rule["verbs"])
        if not {"get", "list", "watch"} <= verbs:
            problems.append(f"{router.name}: its account may only {sorted(verbs)} pods")
    return problems


def _sleep_secs(container: Obj) -> int:
    command = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    return int(command[1]) if command[:1] == ["sleep"] else 0


def check_router_drain(objs: Sequence[Obj]) -> list[str]:
    """The kubelet waits out the preStop sleep and the router's own drain before its SIGKILL."""
    problems = []
    for router in of_kind(objs, "router"):
        grace = float(flag_value(router.args, "--shutdown-grace-secs") or 30.0)
        spec = template(router.workload)["spec"]
        period = spec.get("terminationGracePeriodSeconds", 30)
        sleep = _sleep_secs(router.container)
        if not sleep or period <= sleep + grace:
            problems.append(f"{router.name}: terminationGracePeriodSeconds {period} <= preStop "
                            f"sleep {sleep} + --shutdown-grace-secs {grace:g}")  # fmt: skip
    return problems


def check_monitors(objs: Sequence[Obj]) -> list[str]:
    """ServiceMonitors select a Service by its labels and name one of its ports; PodMonitors
    select pods and name a declared container port."""
    problems = []
    for mon in find(objs, "ServiceMonitor"):
        sel = mon["spec"]["selector"]["matchLabels"]
        services = [s for s in find(objs, "Service") if matches(sel, s["metadata"]["labels"])]
        names = {p.get("name") for s in services for p in s["spec"]["ports"]}
        wanted = {e["port"] for e in mon["spec"]["endpoints"]}
        if not services or not wanted <= names:
            problems.append(f"ServiceMonitor {mon['metadata']['name']}: ports {wanted} not on "
                            f"a selected Service ({names})")  # fmt: skip
    for mon in find(objs, "PodMonitor"):
        sel = mon["spec"]["selector"]["matchLabels"]
        pods = [w for w in workloads(objs) if matches(sel, pod_labels(w))]
        wanted = {e["port"] for e in mon["spec"]["podMetricsEndpoints"]}
        for w in pods:
            containers = template(w)["spec"]["containers"]
            names = {n for c in containers for n in declared_ports(c)}
            if not wanted <= names:
                problems.append(f"PodMonitor {mon['metadata']['name']}: ports {wanted} not "
                                f"declared by {w['metadata']['name']}")  # fmt: skip
        if not pods:
            problems.append(f"PodMonitor {mon['metadata']['name']} selects no pod")
    return problems


def check_selectors_of_workloads(objs: Sequence[Obj]) -> list[str]:
    """Each workload's selector matches its own pods, and PDBs and HPAs point at workloads."""
    problems = []
    for w in workloads(objs):
        if not matches(w["spec"]["selector"]["matchLabels"], pod_labels(w)):
            problems.append(f"{w['metadata']['name']}: selector does not match its pods")
    for pdb in find(objs, "PodDisruptionBudget"):
        sel = pdb["spec"]["selector"]["matchLabels"]
        if not any(matches(sel, pod_labels(w)) for w in workloads(objs)):
            problems.append(f"PodDisruptionBudget {pdb['metadata']['name']} selects no pod")
    for hpa in find(objs, "HorizontalPodAutoscaler"):
        ref = hpa["spec"]["scaleTargetRef"]
        if not find(objs, ref["kind"], ref["name"]):
            problems.append(f"HPA {hpa['metadata']['name']} scales {ref['name']}, not rendered")
    return problems


def check_mooncake_env(objs: Sequence[Obj]) -> list[str]:
    """Workers with the Mooncake L3 reach the master's RPC and metadata ports through its Service,
    and name themselves by their pod IP, which the other workers can reach."""
    problems = []
    for w in workers(objs):
        if flag_value(w.args, "--hicache-storage-backend") != "mooncake":
            continue
        env = container_env(w.container)
        host, _, port = env.get("MOONCAKE_MASTER", "").partition(":")
        meta = urlparse(env.get("MOONCAKE_TE_META_DATA_SERVER", ""))
        by_name = {s["metadata"]["name"]: s for s in find(objs, "Service")}
        svc_ports = {p["name"]: p["port"] for p in by_name.get(host, {}).get("spec", {})
                     .get("ports", [])}  # fmt: skip
        if svc_ports.get("rpc") != int(port or 0):
            problems.append(f"{w.name}: MOONCAKE_MASTER {host}:{port} is no Service's rpc port")
        if meta.hostname != host or svc_ports.get("metadata") != meta.port:
            problems.append(f"{w.name}: MOONCAKE_TE_META_DATA_SERVER {meta.geturl()} is not "
                            f"{host}'s metadata port")  # fmt: skip
        if env.get("MOONCAKE_LOCAL_HOSTNAME") != env.get("POD_IP"):
            problems.append(f"{w.name}: MOONCAKE_LOCAL_HOSTNAME is not the pod IP")
    return problems


ALL_CHECKS = (check_selectors, check_discovery_port, check_services, check_probes,
              check_worker_ports, check_rbac, check_router_drain, check_monitors,
              check_selectors_of_workloads, check_mooncake_env)  # fmt: skip
