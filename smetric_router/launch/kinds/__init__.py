"""Worker kinds the launcher can start; one registration point."""

from __future__ import annotations

from smetric_router.launch.kinds import emulated, sglang
from smetric_router.launch.kinds.base import PlanFn, WorkerLaunch
from smetric_router.launch.spec import ClusterSpec

KINDS: dict[str, PlanFn] = {"emulated": emulated.plan, "sglang": sglang.plan}


def plan_workers(spec: ClusterSpec) -> list[WorkerLaunch]:
    """The worker processes of a spec, in start order (PD: prefills, then decodes)."""
    return KINDS[spec.workers.kind](spec)


__all__ = ["KINDS", "WorkerLaunch", "plan_workers"]
