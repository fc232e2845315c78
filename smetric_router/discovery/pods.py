"""Pods -> workers, without I/O: `decide` says whether one pod is a worker now and which, and
`PodTable` follows a namespace's pods through list and watch events and says what changed.

A pod is a worker while it is Running, its Ready condition is True, it has a pod IP, it is not
being deleted and its labels select a role. The Ready condition is the one the kubelet keeps from
the pod's readiness probe: the router follows what the cluster already decided about the pod
rather than guessing from container states. A pod that stops meeting any of these leaves; a new
IP is a new worker (the old address may be reused by another pod, whose cache is not this one's).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from smetric_router.discovery.base import Change, Discovered, Wanted, diff
from smetric_router.discovery.selectors import LabelSelector
from smetric_router.router.workers import Role, WorkerSpec

# sglang_router's name for the annotation carrying a prefill pod's bootstrap port.
BOOTSTRAP_ANNOTATION = "sglang.ai/bootstrap-port"
ADDED_REASON = "pod_ready"


@dataclass(frozen=True, slots=True)
class PodRules:
    """Which pods are workers, in which role, and at which port."""

    port: int
    selector: LabelSelector = field(default_factory=LabelSelector)  # every worker pod has these
    # PD disaggregation: the role comes from these; None outside PD.
    prefill: LabelSelector | None = None
    decode: LabelSelector | None = None
    bootstrap_annotation: str = BOOTSTRAP_ANNOTATION

    @property
    def pd(self) -> bool:
        return self.prefill is not None or self.decode is not None


@dataclass(frozen=True, slots=True)
class Eligible:
    worker: Discovered


@dataclass(frozen=True, slots=True)
class Ineligible:
    reason: str  # not_selected, not_running, not_ready, no_ip, terminating, ...


PodDecision = Eligible | Ineligible


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _ready(status: Mapping[str, Any]) -> bool:
    return any(
        isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )


def _role(labels: Mapping[str, str], rules: PodRules) -> Role | Ineligible:
    if not rules.selector.matches(labels):
        return Ineligible("not_selected")
    if not rules.pd:
        return Role.WORKER
    prefill = rules.prefill is not None and rules.prefill.matches(labels)
    decode = rules.decode is not None and rules.decode.matches(labels)
    if prefill and decode:
        return Ineligible("role_ambiguous")
    if prefill:
        return Role.PREFILL
    return Role.DECODE if decode else Ineligible("not_selected")


def _bootstrap_port(annotations: Mapping[str, Any], rules: PodRules) -> int | Ineligible | None:
    text = annotations.get(rules.bootstrap_annotation)
    if text is None:
        return None  # the registry reads disaggregation_bootstrap_port from /server_info
    if isinstance(text, str) and text.strip().isdigit() and 0 < int(text) < 65536:
        return int(text)
    return Ineligible("bad_bootstrap_annotation")


def url_of(ip: str, port: int) -> str:
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}"


def decide(pod: Mapping[str, Any], rules: PodRules) -> PodDecision:
    """Whether `pod` (the API's JSON object) is a worker now, and which."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    role = _role(meta.get("labels") or {}, rules)
    if isinstance(role, Ineligible):
        return role
    if meta.get("deletionTimestamp"):
        return Ineligible("terminating")
    if status.get("phase") != "Running":
        return Ineligible("not_running")
    if not _ready(status):
        return Ineligible("not_ready")
    ip = status.get("podIP")
    if not isinstance(ip, str) or not ip:
        return Ineligible("no_ip")
    port: int | None = None
    if role is Role.PREFILL:
        annotated = _bootstrap_port(meta.get("annotations") or {}, rules)
        if isinstance(annotated, Ineligible):
            return annotated
        port = annotated
    try:
        spec = WorkerSpec(url_of(ip, rules.port), role, port)
    except ValueError:
        return Ineligible("bad_ip")
    return Eligible(Discovered(spec, f"pod {pod_key(pod)}"))


class PodTable:
    """The pods seen so far and what each decided; each update returns the changes to apply."""

    def __init__(self, rules: PodRules) -> None:
        self.rules = rules
        self._pods: dict[str, PodDecision] = {}

    def decision(self, key: str) -> PodDecision | None:
        return self._pods.get(key)

    def wanted(self) -> dict[str, Discovered]:
        out: dict[str, Discovered] = {}
        for key in sorted(self._pods):  # two pods on one address: the first by name holds it
            d = self._pods[key]
            if isinstance(d, Eligible):
                out.setdefault(d.worker.url, d.worker)
        return out

    def apply(self, kind: str, pod: Mapping[str, Any]) -> list[Change]:
        """A watch event: ADDED, MODIFIED or DELETED."""
        before = self.wanted()
        key = pod_key(pod)
        if kind == "DELETED":
            self._pods.pop(key, None)
        else:
            self._pods[key] = decide(pod, self.rules)
        return self._changes(before, gone="deleted")

    def replace(self, pods: Iterable[Mapping[str, Any]]) -> list[Change]:
        """A fresh list: pods absent from it were deleted while nobody watched."""
        before = self.wanted()
        self._pods = {pod_key(p): decide(p, self.rules) for p in pods}
        return self._changes(before, gone="resync")

    def _changes(self, before: Wanted, gone: str) -> list[Change]:
        def why(w: Discovered) -> str:
            now = self._pods.get(w.source.removeprefix("pod "))
            if now is None:
                return gone
            if isinstance(now, Ineligible):
                return now.reason
            return "ip_changed" if now.worker.url != w.url else "role_changed"

        return diff(before, self.wanted(), why, ADDED_REASON)
