"""Worker kinds the launcher can start; one registration point."""

from __future__ import annotations

from collections.abc import Callable

from smetric_router.launch.kinds import emulated, sglang
from smetric_router.launch.kinds.base import PlanFn, WorkerLaunch
from smetric_router.launch.spec import ClusterSpec

KINDS: dict[str, PlanFn] = {"emulated": emulated.plan, "sglang": sglang.plan}
# What the router needs to render and tokenize as a kind's workers do.
ROUTER_ARGS: dict[str, Callable[[ClusterSpec], tuple[str, ...]]] = {
    "emulated": emulated.chat_template_args,
    "sglang": sglang.router_tokenizer_args,
}


def plan_workers(spec: ClusterSpec) -> list[WorkerLaunch]:
    """The worker processes of a spec, in start order (PD: prefills, then decodes)."""
    return KINDS[spec.workers.kind](spec)


def router_args_for_workers(spec: ClusterSpec) -> tuple[str, ...]:
    return ROUTER_ARGS[spec.workers.kind](spec)


__all__ = ["KINDS", "WorkerLaunch", "plan_workers", "router_args_for_workers"]
