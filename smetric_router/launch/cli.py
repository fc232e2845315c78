"""python -m smetric_router.launch: the whole stack from one cluster spec."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

from smetric_router.launch.spec import ClusterSpec, load_spec, validate
from smetric_router.launch.stack import Stack, dry_run

log = logging.getLogger("smetric_router.launch")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m smetric_router.launch",
        description="Start SGLang workers and the SMetric router from one cluster spec, wait until "
        "ready, print the URL, and stop everything on Ctrl-C/SIGTERM. A process that dies "
        "meanwhile (worker, router or Mooncake master) is restarted with the same command "
        "line and ports, after a backoff that grows while it keeps dying (0.5 s doubling to "
        "30 s); each exit and restart is logged. Without --config: 4 "
        "emulated SGLang workers (a test and benchmark tool whose timing comes from a model of "
        "an H20 GPU, not from running a model). launch/sglang-cpu.yaml starts real SGLang "
        "workers on CPU (needs `make sglang`), launch/sglang-cpu-pd.yaml a real prefill and "
        "decode pair on CPU; launch/sglang-h20.yaml and sglang-h20-pd.yaml "
        "describe GPU clusters (see --dry-run).",
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="cluster spec YAML (default: the embedded launch/emulated.yaml)",
    )
    p.add_argument("--workers", type=int, default=None, help="number of workers (colocated)")
    p.add_argument("--policy", default=None, help="router policy (default smetric)")
    p.add_argument(
        "--port",
        type=int,
        default=None,
        help="router port (default 30000; 0 = a free port, shown in the ready line)",
    )
    p.add_argument(
        "--speedup",
        type=float,
        default=None,
        help="emulated workers: run the timing model this many times faster than real time",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print every host's commands (Mooncake master, workers with their environment, "
        "router) and exit without starting anything",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def resolve_spec(args: argparse.Namespace) -> ClusterSpec:
    # The dataclass defaults are the embedded spec; launch/emulated.yaml spells out the same values.
    spec = load_spec(args.config) if args.config else ClusterSpec()
    router, workers = spec.router, spec.workers
    if args.port is not None:
        router = replace(router, port=args.port)
    if args.policy is not None:
        router = replace(router, policy=args.policy)
    if args.workers is not None:
        if args.workers < 1:
            raise ValueError("--workers must be >= 1")
        if spec.pd is not None:
            raise ValueError("--workers does not apply to a PD spec (set pd.prefill/pd.decode)")
        workers = replace(workers, count=args.workers)
    if args.speedup is not None:
        workers = replace(workers, speedup=args.speedup)
    spec = replace(spec, router=router, workers=workers)
    validate(spec)
    return spec


def describe(spec: ClusterSpec) -> str:
    kind = "emulated" if spec.workers.kind == "emulated" else f"real SGLang ({spec.sglang.device})"
    tier = ", Mooncake global tier" if spec.mooncake is not None else ""
    if spec.pd is None:
        return f"policy {spec.router.policy}, {spec.workers.count} {kind} workers{tier}"
    return (
        f"PD, prefill policy {spec.router.policy}, {spec.pd.prefill} prefill + "
        f"{spec.pd.decode} decode {kind} workers{tier}"
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    try:
        spec = resolve_spec(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(dry_run(spec), end="")
        return 0
    stack = Stack(spec)
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        stack.start()
        urls = " ".join(stack.worker_urls)
        print(
            f"smetric-router ready at {stack.url} ({describe(spec)}: {urls})\n"
            f"  try: curl {stack.url}/v1/models    Ctrl-C stops everything",
            flush=True,
        )
        # A child that dies is restarted (stack.supervise); only a signal ends the stack.
        while not stopping:
            stack.supervise()
            time.sleep(0.2)
        return 0
    except RuntimeError as e:
        log.error("%s", e)
        return 1
    finally:
        stack.stop()
        log.info("stopped")
