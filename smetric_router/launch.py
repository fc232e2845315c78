"""Start a whole local stack from one cluster spec: emulated SGLang workers + the SMetric router.

    python -m smetric_router.launch                      # 4 emulated workers + router on :30000
    python -m smetric_router.launch --workers 8 --policy load_balance --port 31000
    python -m smetric_router.launch --config launch/emulated.yaml

Every process runs as a child in its own process group; Ctrl-C or SIGTERM stops all of them, and if
any child dies the launcher stops the rest and exits non-zero.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger("smetric_router.launch")

READY_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class RouterSpec:
    host: str = "127.0.0.1"
    port: int = 30000
    policy: str = "smetric"
    overload: float = 2.0
    hit_ratio: float = 0.5
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    kind: str = "emulated"
    count: int = 4
    model_name: str = "qwen3-coder-30b-a3b-emulated"
    base_port: int = 0
    page_size: int = 16
    profile: str = "h20-qwen3-coder-30b-a3b"
    speedup: float = 1.0
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    router: RouterSpec = field(default_factory=RouterSpec)
    workers: WorkerSpec = field(default_factory=WorkerSpec)


def _section(cls: type[Any], raw: object, where: str) -> Any:
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(raw).__name__}")
    known = set(cls.__dataclass_fields__)
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(known)}")
    values = {k: tuple(str(a) for a in v) if k == "extra_args" else v for k, v in raw.items()}
    return cls(**values)


def load_spec(path: Path) -> ClusterSpec:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"cannot read cluster spec {path}: {e}") from e
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping with 'router' and 'workers'")
    unknown = set(raw) - {"router", "workers"}
    if unknown:
        raise ValueError(f"{path}: unknown sections {sorted(unknown)}")
    spec = ClusterSpec(
        router=_section(RouterSpec, raw.get("router"), f"{path}: router"),
        workers=_section(WorkerSpec, raw.get("workers"), f"{path}: workers"),
    )
    if spec.workers.kind != "emulated":
        raise ValueError(
            f"{path}: workers.kind {spec.workers.kind!r} is not supported by this launcher yet; "
            "start real SGLang workers yourself and run `smetric-router --worker-urls ...`"
        )
    if spec.workers.count < 1:
        raise ValueError(f"{path}: workers.count must be >= 1")
    return spec


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    ready_url: str


class Stack:
    """The processes of one launched cluster."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.children: list[Child] = []
        self.worker_urls: list[str] = []
        r = spec.router
        self.url = f"http://{r.host}:{r.port}"

    def _spawn(self, name: str, args: list[str], ready_url: str) -> None:
        cmd = [sys.executable, "-m", *args]
        log.info("starting %s: %s", name, " ".join(cmd))
        proc = subprocess.Popen(cmd, start_new_session=True)
        self.children.append(Child(name, proc, ready_url))

    def start(self) -> None:
        w, r = self.spec.workers, self.spec.router
        if _port_in_use(r.host, r.port):
            raise RuntimeError(f"router port {r.host}:{r.port} is already in use (use --port)")
        for i in range(w.count):
            port = w.base_port + 3 * i if w.base_port else free_port()
            events = w.base_port + 3 * i + 1 if w.base_port else free_port()
            replay = w.base_port + 3 * i + 2 if w.base_port else free_port()
            url = f"http://127.0.0.1:{port}"
            self.worker_urls.append(url)
            self._spawn(
                f"worker-{i}",
                [
                    "smetric_router.emulator",
                    "--host", "127.0.0.1", "--port", str(port),
                    "--model-name", w.model_name,
                    "--page-size", str(w.page_size),
                    "--profile", w.profile,
                    "--speedup", str(w.speedup),
                    "--kv-events-port", str(events),
                    "--kv-events-replay-port", str(replay),
                    *w.extra_args,
                ],
                f"{url}/health",
            )  # fmt: skip
        self._wait_ready(self.children)
        self._spawn(
            "router",
            [
                "smetric_router",
                "--host", r.host, "--port", str(r.port),
                "--policy", r.policy,
                "--overload", str(r.overload),
                "--hit-ratio", str(r.hit_ratio),
                "--worker-urls", *self.worker_urls,
                *r.extra_args,
            ],
            f"{self.url}/readiness",
        )  # fmt: skip
        self._wait_ready(self.children[-1:])

    def _wait_ready(self, children: list[Child]) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        pending = list(children)
        while pending:
            for c in list(pending):
                if c.proc.poll() is not None:
                    raise RuntimeError(
                        f"{c.name} exited with code {c.proc.returncode} during start-up"
                    )
                try:
                    with urllib.request.urlopen(c.ready_url, timeout=1) as resp:
                        if resp.status == 200:
                            pending.remove(c)
                except (urllib.error.URLError, OSError):
                    pass
            if pending and time.monotonic() > deadline:
                names = ", ".join(c.name for c in pending)
                raise RuntimeError(f"not ready after {READY_TIMEOUT_S:.0f}s: {names}")
            if pending:
                time.sleep(0.1)

    def dead_child(self) -> Child | None:
        return next((c for c in self.children if c.proc.poll() is not None), None)

    def stop(self) -> None:
        for c in reversed(self.children):
            if c.proc.poll() is None:
                os.killpg(c.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for c in self.children:
            try:
                c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop on SIGTERM; killing it", c.name)
                os.killpg(c.proc.pid, signal.SIGKILL)
                c.proc.wait()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m smetric_router.launch",
        description="Start emulated SGLang workers and the SMetric router on 127.0.0.1 from one "
        "cluster spec, wait until ready, print the URL, and stop everything on Ctrl-C/SIGTERM. "
        "The workers are emulated (a test and benchmark tool): their timing comes from a model "
        "of an H20 GPU, not from running a model.",
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="cluster spec YAML (default: the embedded launch/emulated.yaml)",
    )
    p.add_argument("--workers", type=int, default=None, help="number of emulated workers")
    p.add_argument("--policy", default=None, help="router policy (default smetric)")
    p.add_argument("--port", type=int, default=None, help="router port (default 30000)")
    p.add_argument(
        "--speedup",
        type=float,
        default=None,
        help="run the workers' timing model this many times faster than real time",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p  # fmt: skip


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
        workers = replace(workers, count=args.workers)
    if args.speedup is not None:
        workers = replace(workers, speedup=args.speedup)
    return ClusterSpec(router=router, workers=workers)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    try:
        spec = resolve_spec(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    stack = Stack(spec)
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        stack.start()
        print(
            f"smetric-router ready at {stack.url} (policy {spec.router.policy}, "
            f"{spec.workers.count} emulated workers: {' '.join(stack.worker_urls)})\n"
            f"  try: curl {stack.url}/v1/models    Ctrl-C stops everything",
            flush=True,
        )
        while not stopping:
            dead = stack.dead_child()
            if dead is not None:
                log.error("%s exited with code %s; stopping the stack", dead.name,
                          dead.proc.returncode)  # fmt: skip
                return 1
            time.sleep(0.2)
        return 0
    except RuntimeError as e:
        log.error("%s", e)
        return 1
    finally:
        stack.stop()
        log.info("stopped")


if __name__ == "__main__":
    sys.exit(main())
