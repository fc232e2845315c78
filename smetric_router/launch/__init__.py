"""Start a whole local stack from one cluster spec: SGLang workers (emulated or real) + router.

    python -m smetric_router.launch                      # 4 emulated workers + router on :30000
    python -m smetric_router.launch --workers 8 --policy load_balance --port 31000
    python -m smetric_router.launch --config launch/emulated-pd.yaml   # PD: 4 prefill + 2 decode
    python -m smetric_router.launch --config launch/sglang-cpu.yaml    # 2 real SGLang workers (CPU)
    python -m smetric_router.launch --config launch/sglang-cpu-pd.yaml # real prefill + decode (CPU)
    python -m smetric_router.launch --config launch/sglang-h20.yaml --dry-run   # GPU nodes

Modules: spec (the YAML as frozen dataclasses), kinds (one module per worker kind, behind one
plan function), stack (processes: start, wait for health, stop), cli, tiny_model (the model real
SGLang workers serve on CPU). Every process runs as a child in its own process group; Ctrl-C or
SIGTERM stops all of them, and if any child dies the launcher stops the rest and exits non-zero.
"""

from smetric_router.launch.cli import build_parser, main, resolve_spec
from smetric_router.launch.kinds import plan_workers
from smetric_router.launch.kinds.base import WorkerLaunch
from smetric_router.launch.ports import free_port, free_ports
from smetric_router.launch.spec import (
    ClusterSpec,
    MooncakeSpec,
    PdSpec,
    RouterSpec,
    SglangSpec,
    WorkerSpec,
    load_spec,
)
from smetric_router.launch.stack import Stack, dry_run, pd_worker_args, router_args

__all__ = [
    "ClusterSpec", "MooncakeSpec", "PdSpec", "RouterSpec", "SglangSpec", "Stack", "WorkerLaunch",
    "WorkerSpec", "build_parser", "dry_run", "free_port", "free_ports", "load_spec", "main",
    "pd_worker_args", "plan_workers", "resolve_spec", "router_args",
]  # fmt: skip
