"""deploy/ as the cluster would see it: each overlay rendered by ``kubectl kustomize`` (Kustomize
built into kubectl; no cluster is contacted), and the checks its objects must pass, written as
functions that return the problems they find so that a test can also show a broken object is
caught.

- ``SMETRIC_REQUIRE_DEPLOY=1`` (what ``make test`` sets): a missing ``kubectl`` or
  ``kubernetes-validate`` fails the tests instead of skipping them (``make setup`` installs both).

Command lines are read as the kubelet runs them: ``$(VAR)`` in args expands from the container's
env, the pod IP standing in as ``SAMPLE_POD_IP``.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
OVERLAYS = ("h20", "pd", "cpu")
COMPONENTS = ("hpa", "monitoring")
ENV_REQUIRE = "SMETRIC_REQUIRE_DEPLOY"
# The Kubernetes release whose API schemas the objects must match (kubernetes-validate bundles it).
KUBERNETES_VERSION = "1.37"
# Kinds that are CustomResourceDefinitions of an operator, with no schema in Kubernetes' own.
CRD_KINDS = frozenset({("monitoring.coreos.com/v1", "ServiceMonitor"),
                       ("monitoring.coreos.com/v1", "PodMonitor")})  # fmt: skip
SAMPLE_POD_IP = "10.244.7.21"
SAMPLE_NAMESPACE = "smetric"
WORKLOAD_KINDS = frozenset({"Deployment", "StatefulSet"})

# The router's Kubernetes discovery flags (smg's names) and how many values each takes
# (None: one or more).
DISCOVERY_FLAGS: Mapping[str, int | None] = {
    "--service-discovery": 0,
    "--discovery-provider": 1,
    "--selector": None,
    "--service-discovery-port": 1,
    "--service-discovery-namespace": 1,
    "--prefill-selector": None,
    "--decode-selector": None,
    "--discovery-file": 1,
}

Obj = dict[str, Any]


def _missing(what: str) -> None:
    reason = f"{what} (make setup installs it)"
    if os.environ.get(ENV_REQUIRE) == "1":
        pytest.fail(f"{reason}; {ENV_REQUIRE}=1 makes this a failure")
    pytest.skip(reason)


def require_kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        _missing("kubectl not found")
    assert path is not None
    return path


def require_validator() -> Any:
    try:
        import kubernetes_validate
    except ImportError:
        _missing("kubernetes-validate is not installed")
    return kubernetes_validate


def _kustomize(path: str) -> tuple[str, str]:
    proc = subprocess.run([require_kubectl(), "kustomize", path], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    return proc.stdout, proc.stderr if proc.returncode else ""


@functools.cache
def _overlay(overlay: str) -> tuple[str, str]:
    return _kustomize(str(DEPLOY / "overlays" / overlay))


def render(overlay: str, components: Sequence[str] = ()) -> list[Obj]:
    """The objects of deploy/overlays/OVERLAY, with optional components of deploy/components
    (fresh objects each call: tests mutate them)."""
    if not components:
        out, err = _overlay(overlay)
    else:
        # Kustomize takes only relative paths to other kustomizations
        with tempfile.TemporaryDirectory() as tmp:
            doc = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                   "resources": [os.path.relpath(DEPLOY / "overlays" / overlay, tmp)],
                   "components": [os.path.relpath(DEPLOY / "components" / c, tmp)
                                  for c in components]}  # fmt: skip
            (Path(tmp) / "kustomization.yaml").write_text(yaml.safe_dump(doc))
            out, err = _kustomize(tmp)
    assert not err, f"kubectl kustomize {overlay} {list(components)} failed:\n{err}"
    return [o for o in yaml.safe_load_all(out) if o]


def find(objs: Sequence[Obj], kind: str, name: str | None = None) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind and name in (None, o["metadata"]["name"])]


def pod_template(obj: Obj) -> Obj | None:
    if obj["kind"] not in WORKLOAD_KINDS:
        return None
    template: Obj = obj["spec"]["template"]
    return template


def template(obj: Obj) -> Obj:
    """A workload's pod template."""
    t = pod_template(obj)
    assert t is not None, f"{obj['kind']} {obj['metadata']['name']} has no pod template"
    return t


def workloads(objs: Sequence[Obj]) -> list[Obj]:
    return [o for o in objs if o["kind"] in WORKLOAD_KINDS]


def matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def pod_labels(obj: Obj) -> dict[str, str]:
    labels: dict[str, str] = template(obj)["metadata"].get("labels", {})
    return labels


def declared_ports(container: Obj) -> dict[str | int, int]:
    """A container's ports by name and by number, as a probe or Service may name them."""
    out: dict[str | int, int] = {}
    for p in container.get("ports", []):
        out[p["containerPort"]] = p["containerPort"]
        if "name" in p:
            out[p["name"]] = p["containerPort"]
    return out


# --- command lines -----------------------------------------------------------------------------

_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def container_env(container: Obj, namespace: str = SAMPLE_NAMESPACE) -> dict[str, str]:
    """The container's environment as the kubelet builds it (a Secret's value as ``<secret>``)."""
    env: dict[str, str] = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = expand(e["value"], env)
            continue
        source = e["valueFrom"]
        field = source.get("fieldRef", {}).get("fieldPath")
        if field == "status.podIP":
            env[e["name"]] = SAMPLE_POD_IP
        elif field == "metadata.namespace":
            env[e["name"]] = namespace
        else:
            env[e["name"]] = "<secret>"
    return env


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: an unknown name stays as written."""
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), text)


def argv(container: Obj) -> list[str]:
    env = container_env(container)
    return [expand(a, env) for a in (*container.get("command", []), *container.get("args", []))]


@dataclass(frozen=True)
class Process:
    """One container of a rendered workload and what it runs."""

    workload: Obj
    container: Obj
    kind: str  # router | sglang | emulator | mooncake-master
    args: tuple[str, ...]  # what follows the program (the router image's entrypoint, or command)

    @property
    def name(self) -> str:
        return f"{self.workload['metadata']['name']}/{self.container['name']}"


def classify(container: Obj) -> tuple[str, tuple[str, ...]]:
    command = container.get("command", [])
    full = argv(container)
    if not command:  # the router image's entrypoint, smetric-router
        return "router", tuple(full)
    if command[1:3] == ["-m", "sglang.launch_server"]:
        return "sglang", tuple(full[3:])
    if command[1:3] == ["-m", "smetric_router.emulator"]:
        return "emulator", tuple(full[3:])
    if command[0] == "mooncake_master":
        return "mooncake-master", tuple(full[1:])
    raise AssertionError(f"unknown program in container {container['name']}: {command}")


def processes(objs: Sequence[Obj]) -> list[Process]:
    out = []
    for w in workloads(objs):
        for c in template(w)["spec"]["containers"]:
            kind, args = classify(c)
            out.append(Process(w, c, kind, args))
    return out


def of_kind(objs: Sequence[Obj], kind: str) -> list[Process]:
    return [p for p in processes(objs) if p.kind == kind]


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value of `--flag V` or `--flag=V` (the last one given), else None."""
    value = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a.partition("=")[2]
    return value


def split_discovery(args: Sequence[str]) -> tuple[list[str], dict[str, list[str]]]:
    """The router's arguments without its discovery flags, and those flags with their values."""
    rest: list[str] = []
    found: dict[str, list[str]] = {}
    items = iter(args)
    pending: str | None = None  # a flag that takes one or more values, still reading them
    for a in items:
        name, eq, inline = a.partition("=")
        if pending is not None and not a.startswith("--"):
            found[pending].append(a)
            continue
        pending = None
        if name not in DISCOVERY_FLAGS:
            rest.append(a)
            continue
        arity = DISCOVERY_FLAGS[name]
        found[name] = [inline] if eq else []
        if arity == 1 and not eq:
            found[name].append(next(items, ""))
        elif arity is None:
            pending = name
    return rest, found


def selector(values: Sequence[str]) -> dict[str, str]:
    """`key=value ...` (each value may itself hold several, comma-separated) as a label map."""
    out: dict[str, str] = {}
    for v in values:
        for pair in v.split(","):
            key, eq, value = pair.partition("=")
            assert eq and key and value, f"selector {v!r}: expected key=value"
            out[key.strip()] = value.strip()
    return out


def router_error(args: Sequence[str]) -> str | None:
    """What the router's own argument parser (router/cli.py, flags from RouterConfig) says about
    a command line: None when it accepts it, else its error line."""
    from smetric_router.router.cli import parse

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parse(list(args))
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1]
    return None


def unrecognized(error: str | None) -> list[str]:
    """The flags an argparse error calls unrecognized."""
    if error is None or "unrecognized arguments:" not in error:
        return []
    return [w for w in error.split("unrecognized arguments:")[1].split() if w.startswith("--")]


def emulator_error(args: Sequence[str]) -> str | None:
    """What the emulator's own parser and config say about a command line (None: accepted)."""
    from smetric_router.emulator.__main__ import config_from_args, parse_args

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            config_from_args(parse_args(list(args)))
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1]
    except ValueError as e:
        return str(e)
    return None


def iter_probes(container: Obj) -> Iterator[tuple[str, Obj]]:
    for name in ("startupProbe", "readinessProbe", "livenessProbe"):
        if name in container:
            yield name, container[name]
