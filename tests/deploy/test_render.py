"""Every overlay of deploy/ renders with Kustomize (kubectl's), alone and with each optional
component, and every object it renders is valid against the Kubernetes API schema of a current
release (kubernetes-validate's bundled schemas, strict: an unknown or misplaced field fails)."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from tests.deploy.manifests import (
    COMPONENTS,
    CRD_KINDS,
    DEPLOY,
    KUBERNETES_VERSION,
    OVERLAYS,
    REPO,
    Obj,
    find,
    render,
    require_validator,
)
from tests.docs.markdown import code_blocks, shell_commands

RENDERS = [(o, ()) for o in OVERLAYS] + [(o, (c,)) for o in OVERLAYS for c in COMPONENTS]


def schema_problems(objs: list[Obj]) -> list[str]:
    validator: Any = require_validator()
    problems = []
    for obj in objs:
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            continue  # an operator's CRD: tests/deploy/checks.py checks what it points at
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        try:
            validator.validate(obj, KUBERNETES_VERSION, strict=True)
        except validator.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            problems.append(f"{name}: {path}: {e.message}")
        except validator.SchemaNotFoundError as e:
            problems.append(f"{name}: no schema ({e.message})")
    return problems


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_the_whole_stack(overlay: str) -> None:
    objs = render(overlay)
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objs}
    assert ("Deployment", "smetric-router") in kinds
    assert {("ServiceAccount", "smetric-router"), ("Role", "smetric-router-discovery"),
            ("RoleBinding", "smetric-router-discovery"), ("Service", "smetric-router"),
            ("PodDisruptionBudget", "smetric-router")} <= kinds  # fmt: skip
    assert len(find(objs, "StatefulSet")) == (2 if overlay == "pd" else 1)
    assert bool(find(objs, "Deployment", "mooncake-master")) == (overlay != "cpu")
    namespaced = [o for o in objs if o["kind"] != "Namespace"]
    assert {o["metadata"].get("namespace") for o in namespaced} == {"smetric"}
    assert find(objs, "Namespace", "smetric")


@pytest.mark.parametrize("component", COMPONENTS)
def test_components_add_their_objects(component: str) -> None:
    added = {"hpa": {"HorizontalPodAutoscaler"}, "monitoring": {"ServiceMonitor", "PodMonitor"}}
    for overlay in OVERLAYS:
        before = {o["kind"] for o in render(overlay)}
        after = {o["kind"] for o in render(overlay, (component,))}
        assert after - before == added[component], overlay


@pytest.mark.parametrize(("overlay", "components"), RENDERS, ids=lambda v: "+".join(v) or "-")
def test_objects_match_the_kubernetes_schema(overlay: str, components: tuple[str, ...]) -> None:
    objs = render(overlay, components)
    assert objs
    assert schema_problems(objs) == []


def test_the_schema_check_reports_a_wrong_field() -> None:
    objs = render("h20")
    broken = copy.deepcopy(objs)
    (router,) = find(broken, "Deployment", "smetric-router")
    router["spec"]["replica"] = 3  # misspelled
    (service,) = find(broken, "Service", "smetric-router")
    service["spec"]["ports"][0]["port"] = "http"  # a name where a number belongs
    problems = schema_problems(broken)
    assert any(p.startswith("Deployment/smetric-router") and "replica" in p for p in problems)
    assert any(p.startswith("Service/smetric-router") and "ports.0.port" in p for p in problems)
    assert len(problems) == 2, problems


def test_the_images_are_the_ones_the_dockerfiles_build() -> None:
    """The image names in the manifests are those the Dockerfiles' build commands tag."""
    built = {}
    for dockerfile in (REPO / "Dockerfile", DEPLOY / "docker" / "sglang-worker.Dockerfile"):
        m = re.search(r"docker build .*-t (\S+):(\S+)", dockerfile.read_text())
        assert m, f"{dockerfile}: no `docker build -t NAME:TAG` in its header"
        built[m.group(1)] = m.group(2)
    for overlay in OVERLAYS:
        for obj in render(overlay):
            spec = obj.get("spec", {}).get("template", {}).get("spec", {})
            for c in spec.get("containers", []):
                name, _, tag = c["image"].partition(":")
                assert built.get(name) == tag, (overlay, c["image"], built)


def test_the_router_image_matches_what_the_manifests_assume() -> None:
    text = (REPO / "Dockerfile").read_text()
    bases = re.findall(r"^FROM (\S+)", text, re.M)
    assert bases and all(b.startswith("python:3.11-slim") for b in bases), bases
    assert re.search(r"^USER 10001:10001$", text, re.M)
    assert re.search(r'^ENTRYPOINT \["smetric-router"\]$', text, re.M)
    assert (
        'smetric-router = "smetric_router.router.cli:main"' in (REPO / "pyproject.toml").read_text()
    )
    # the CPU overlay names files inside the installed package, under the image's Python
    for obj in render("cpu"):
        for c in obj.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            for arg in c.get("args", []):
                _, _, path = arg.partition("=")
                prefix = "/usr/local/lib/python3.11/site-packages/"
                if path.startswith(prefix):
                    assert (REPO / path[len(prefix) :]).is_file(), path


def test_the_worker_image_applies_the_patch_set() -> None:
    text = (DEPLOY / "docker" / "sglang-worker.Dockerfile").read_text()
    assert re.search(r"^FROM \$\{SGLANG_IMAGE\}$", text, re.M)
    assert re.search(r"^ARG SGLANG_IMAGE=lmsysorg/sglang:v0\.5\.23\b", text, re.M)
    m = re.search(r"smetric_router\.patches apply --patch-dir (\S+)", text)
    assert m and f"COPY patches {m.group(1)}" in text
    assert list((REPO / "patches").glob("sglang-0.5.23-*.patch"))
    # what the COPY lines of both Dockerfiles need passes .dockerignore
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for dockerfile in (REPO / "Dockerfile", DEPLOY / "docker" / "sglang-worker.Dockerfile"):
        for line in re.findall(r"^COPY (?!--from)(.+) \S+$", dockerfile.read_text(), re.M):
            assert set(line.split()) <= allowed, (dockerfile.name, line)


def test_the_docs_apply_overlays_that_exist() -> None:
    page = REPO / "docs" / "deploy.md"
    dirs = []
    for block in code_blocks(page):
        if block.lang not in ("bash", "sh", "shell"):
            continue
        for _, words in shell_commands(block.text):
            if words[:1] == ["kubectl"] and "-k" in words:
                dirs.append(words[words.index("-k") + 1])
            elif words[:2] == ["kubectl", "kustomize"]:
                dirs.append(words[2])
    assert "deploy/overlays/cpu" in dirs
    for d in dirs:
        assert (REPO / d / "kustomization.yaml").is_file(), d
