"""Start a whole local stack from one cluster spec: emulated SGLang workers + the SMetric router.

    python -m smetric_router.launch                      # 4 emulated workers + router on :30000
    python -m smetric_router.launch --workers 8 --policy load_balance --port 31000
    python -m smetric_router.launch --config launch/emulated.yaml
    python -m smetric_router.launch --config launch/emulated-pd.yaml   # PD: 4 prefill + 2 decode

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
class PdSpec:
    """PD disaggregation: prefill and decode instances instead of workers.count colocated ones;
    router.policy becomes the prefill policy."""

    prefill: int = 4
    decode: int = 2
    transfer_gbps: float = 200.0  # the modelled prefill -> decode KV link
    decode_kv_timeout_secs: float = 300.0
    decode_policy: str = ""  # the router's --decode-policy; empty: the router's default
    prefill_extra_args: tuple[str, ...] = ()
    decode_extra_args: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    router: RouterSpec = field(default_factory=RouterSpec)
    workers: WorkerSpec = field(default_factory=WorkerSpec)
    pd: PdSpec | None = None  # None: colocated workers


def _section(cls: type[Any], raw: object, where: str) -> Any:
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(raw).__name__}")
    known = set(cls.__dataclass_fields__)
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(known)}")
    values = {
        k: tuple(str(a) for a in v) if k.endswith("extra_args") else v for k, v in raw.items()
    }
    return cls(**values)


def load_spec(path: Path) -> ClusterSpec:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"cannot read cluster spec {path}: {e}") from e
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping with 'router' and 'workers'")
    unknown = set(raw) - {"router", "workers", "pd"}
    if unknown:
        raise ValueError(f"{path}: unknown sections {sorted(unknown)}")
    spec = ClusterSpec(
        router=_section(RouterSpec, raw.get("router"), f"{path}: router"),
        workers=_section(WorkerSpec, raw.get("workers"), f"{path}: workers"),
        pd=None if "pd" not in raw else _section(PdSpec, raw["pd"], f"{path}: pd"),
    )
    if spec.pd is not None:
        if isinstance(raw.get("workers"), dict) and "count" in raw["workers"]:
            raise ValueError(f"{path}: workers.count does not apply with pd; set pd.prefill/decode")
        if spec.pd.prefill < 1 or spec.pd.decode < 1:
            raise ValueError(f"{path}: pd.prefill and pd.decode must be >= 1")
    if spec.workers.kind != "emulated":
        raise ValueError(
            f"{path}: workers.kind {spec.workers.kind!r} is not supported by this launcher yet; "
            "start real SGLang workers yourself and run `smetric-router --worker-urls ...`"
        )
    if spec.workers.count < 1:
        raise ValueError(f"{path}: workers.count must be >= 1")
    return spec


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n distinct free ports, held together while chosen so none is handed out twice."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


@dataclass(frozen=True, slots=True)
class WorkerLaunch:
    """One emulated worker to start: its name, URL, role and emulator arguments."""

    name: str
    url: str
    args: tuple[str, ...]
    role: str = "null"  # null (colocated) | prefill | decode
    bootstrap_port: int | None = None  # prefill: where its decode instances fetch KV


def plan_workers(spec: ClusterSpec) -> list[WorkerLaunch]:
    """The workers of a spec, with their ports: consecutive from workers.base_port, else free."""
    w, pd = spec.workers, spec.pd
    n_ports = 3 * w.count if pd is None else 4 * pd.prefill + pd.decode
    if w.base_port:
        ports = iter(range(w.base_port, w.base_port + n_ports))
    else:  # never the router's port, which is free until the router starts
        ports = iter([p for p in free_ports(n_ports + 1) if p != spec.router.port][:n_ports])

    def port() -> int:
        return next(ports)

    common = ("--host", "127.0.0.1", "--model-name", w.model_name, "--page-size",
              str(w.page_size), "--profile", w.profile, "--speedup", str(w.speedup))  # fmt: skip

    def kv_events() -> tuple[str, ...]:
        return ("--kv-events-port", str(port()), "--kv-events-replay-port", str(port()))

    plan = []
    if pd is None:
        for i in range(w.count):
            http = port()
            args = ("smetric_router.emulator", "--port", str(http), *common, *kv_events(),
                    *w.extra_args)  # fmt: skip
            plan.append(WorkerLaunch(f"worker-{i}", f"http://127.0.0.1:{http}", args))
        return plan
    for i in range(pd.prefill):
        http = port()
        events = kv_events()
        bootstrap = port()
        args = ("smetric_router.emulator", "--port", str(http), *common, *events,
                "--role", "prefill", "--disaggregation-bootstrap-port", str(bootstrap),
                *w.extra_args, *pd.prefill_extra_args)  # fmt: skip
        url = f"http://127.0.0.1:{http}"
        plan.append(WorkerLaunch(f"prefill-{i}", url, args, "prefill", bootstrap))
    for i in range(pd.decode):
        # no KV events: a decode instance's cache is not what the router routes by
        http = port()
        args = ("smetric_router.emulator", "--port", str(http), *common, "--role", "decode",
                "--transfer-gbps", str(pd.transfer_gbps),
                "--decode-kv-timeout-secs", str(pd.decode_kv_timeout_secs),
                *w.extra_args, *pd.decode_extra_args)  # fmt: skip
        plan.append(WorkerLaunch(f"decode-{i}", f"http://127.0.0.1:{http}", args, "decode"))
    return plan


def router_args(spec: ClusterSpec, workers: list[WorkerLaunch]) -> list[str]:
    """The router's command line (after `python -m`) for these workers."""
    r, pd = spec.router, spec.pd
    args = ["smetric_router", "--host", r.host, "--port", str(r.port),
            "--overload", str(r.overload), "--hit-ratio", str(r.hit_ratio)]  # fmt: skip
    if pd is None:
        args += ["--policy", r.policy, "--worker-urls", *(w.url for w in workers)]
        return args + list(r.extra_args)
    # sglang_router's PD spellings: --prefill URL BOOTSTRAP_PORT and --decode URL, repeated
    args += ["--pd-disaggregation", "--prefill-policy", r.policy]
    if pd.decode_policy:
        args += ["--decode-policy", pd.decode_policy]
    for w in workers:
        if w.role == "prefill":
            args += ["--prefill", w.url, str(w.bootstrap_port)]
        elif w.role == "decode":
            args += ["--decode", w.url]
    return args + list(r.extra_args)


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
        self.workers: list[WorkerLaunch] = []
        r = spec.router
        self.url = f"http://{r.host}:{r.port}"

    @property
    def worker_urls(self) -> list[str]:
        return [w.url for w in self.workers]

    def _spawn(self, name: str, args: list[str], ready_url: str) -> None:
        cmd = [sys.executable, "-m", *args]
        log.info("starting %s: %s", name, " ".join(cmd))
        proc = subprocess.Popen(cmd, start_new_session=True)
        self.children.append(Child(name, proc, ready_url))

    def start(self) -> None:
        r = self.spec.router
        if _port_in_use(r.host, r.port):
            raise RuntimeError(f"router port {r.host}:{r.port} is already in use (use --port)")
        self.start_workers()
        self._spawn("router", router_args(self.spec, self.workers), f"{self.url}/readiness")
        self._wait_ready(self.children[-1:])

    def start_workers(self) -> None:
        self.workers = plan_workers(self.spec)
        for w in self.workers:
            self._spawn(w.name, list(w.args), f"{w.url}/health")
        self._wait_ready(self.children)

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
        if spec.pd is not None:
            raise ValueError("--workers does not apply to a PD spec (set pd.prefill/pd.decode)")
        workers = replace(workers, count=args.workers)
    if args.speedup is not None:
        workers = replace(workers, speedup=args.speedup)
    return replace(spec, router=router, workers=workers)


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
        urls = " ".join(stack.worker_urls)
        if spec.pd is None:
            what = f"policy {spec.router.policy}, {spec.workers.count} emulated workers"
        else:
            what = (
                f"PD, prefill policy {spec.router.policy}, {spec.pd.prefill} prefill + "
                f"{spec.pd.decode} decode emulated workers"
            )
        print(
            f"smetric-router ready at {stack.url} ({what}: {urls})\n"
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
