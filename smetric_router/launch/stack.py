"""Start, watch and stop the processes of one cluster spec.

Every local process runs as a child in its own process group; stop() takes them down in reverse
start order (router, workers, then, once they are gone, the Mooncake master). Processes for other
hosts are printed for the operator to start there; the launcher then waits for their health like
for its own.

Ports given as 0 (the router's `port: 0`, emulated workers without `base_port`) are bound by the
processes themselves, which report them through `--port-file`: no port is chosen here and then
lost to another process before the child binds it.

Once started, supervise() restarts a local child that died: the same command line on the same
ports (those it reported pinned in place of 0), after a backoff that doubles while it keeps
dying soon after its start, up to a cap; a child that keeps failing is retried at the cap forever.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path

from smetric_router.core.port_file import read_port_file
from smetric_router.launch.kinds import plan_workers, router_args_for_workers
from smetric_router.launch.kinds.base import LOCAL_HOSTS, WorkerLaunch
from smetric_router.launch.kinds.sglang import (
    check_local_python,
    mooncake_master_argv,
)
from smetric_router.launch.ports import port_in_use
from smetric_router.launch.spec import ClusterSpec

log = logging.getLogger("smetric_router.launch")


class ChildExited(RuntimeError):
    """A child exited before it was ready."""


READY_TIMEOUT_S = 60.0
# One readiness probe's limit. SGLang started with --sleep-on-idle (what the CPU workers use)
# answers /health only after its scheduler's idle sleep, ~1.0 s: a 1 s limit timed out on most
# probes, so a ready worker was seen ready only by luck, tens of seconds late.
PROBE_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 15.0
# Restarts: the first after RESTART_BASE_S, doubling while the child dies within STABLE_S of its
# start, at most RESTART_CAP_S; one that ran STABLE_S or longer starts a new streak.
RESTART_BASE_S = 0.5
RESTART_CAP_S = 30.0
STABLE_S = 10.0
# Workers whose ports the launcher chose (real SGLang cannot report its own) are started again on
# fresh ports when one dies during start-up: another listener may have taken a port in between.
START_ATTEMPTS = 3
FAILING_AFTER = 5  # quick deaths in a row after which the child is reported as failing
READY_POLL_S = 1.0  # how often a restarted child's readiness is checked (for the log)
# The flags a port reported under each name is given with, to pin it on a restart.
PORT_FLAGS = {
    "http": "--port",
    "kv_events": "--kv-events-port",
    "kv_events_replay": "--kv-events-replay-port",
    "bootstrap": "--disaggregation-bootstrap-port",
    "prometheus": "--prometheus-port",
}
MASTER = "mooncake-master"
_ROLE = {"null": "colocated", "prefill": "prefill", "decode": "decode"}


def router_args(spec: ClusterSpec, workers: list[WorkerLaunch]) -> list[str]:
    """The router's command line (after `python -m`) for these workers."""
    r, pd = spec.router, spec.pd
    args = ["smetric_router", "--host", r.host, "--port", str(r.port),  # 0: see Stack.start
            "--overload", str(r.overload), "--hit-ratio", str(r.hit_ratio)]  # fmt: skip
    args += router_args_for_workers(spec)  # it must render and tokenize as the workers do
    m = spec.mooncake
    if m is not None and r.l3_view != "off":
        args += ["--l3-view", r.l3_view]
        if r.l3_view == "master":
            args += ["--mooncake-master-url", f"http://{m.host}:{m.metrics_port}"]
    if pd is None:
        args += ["--policy", r.policy, "--worker-urls", *(w.url for w in workers)]
        return args + list(r.extra_args)
    args += ["--pd-disaggregation", "--prefill-policy", r.policy]
    if pd.decode_policy:
        args += ["--decode-policy", pd.decode_policy]
    return args + pd_worker_args(workers) + list(r.extra_args)


def pd_worker_args(workers: list[WorkerLaunch]) -> list[str]:
    """The PD instances in sglang_router's spellings, which smetric-router and smg share:
    --prefill URL BOOTSTRAP_PORT and --decode URL, repeated."""
    args: list[str] = []
    for w in workers:
        if w.role == "prefill":
            args += ["--prefill", w.url, str(w.bootstrap_port)]
        elif w.role == "decode":
            args += ["--decode", w.url]
    return args


def restart_delay(
    quick_deaths: int, base: float = RESTART_BASE_S, cap: float = RESTART_CAP_S
) -> float:
    """Seconds to wait before restarting a child that has died `quick_deaths` (>= 1) times in a
    row soon after its start: base, then doubling, at most cap."""
    return min(cap, base * 2.0 ** min(max(quick_deaths, 1) - 1, 62))


def pin_ports(argv: list[str], ports: dict[str, int]) -> list[str]:
    """argv with each reported port given to its flag (PORT_FLAGS) instead of the 0 it had."""
    flags = {PORT_FLAGS[name]: str(port) for name, port in ports.items() if name in PORT_FLAGS}
    out = list(argv)
    for i, arg in enumerate(out):
        name, eq, _ = arg.partition("=")
        if name not in flags:
            continue
        if eq:
            out[i] = f"{name}={flags[name]}"
        elif i + 1 < len(out):
            out[i + 1] = flags[name]
    return out


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes] | None  # None: runs on another host, started by the operator
    ready_url: str
    ready_timeout_s: float = READY_TIMEOUT_S
    port_file: Path | None = None  # where it reports the ports it bound (given as 0)
    argv: list[str] = field(default_factory=list)  # how it was started, to restart it
    env: dict[str, str] | None = None
    started_at: float = 0.0  # time.monotonic() of its latest start
    quick_deaths: int = 0  # deaths in a row within STABLE_S of a start
    restarts: int = 0
    restart_at: float | None = None  # set while it is dead and waiting for its restart
    waiting_ready: bool = False  # restarted, not yet seen ready
    next_ready_poll: float = 0.0


class Stack:
    """The processes of one launched cluster."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.children: list[Child] = []
        self.workers: list[WorkerLaunch] = []
        r = spec.router
        self.url = f"http://{r.host}:{r.port}"  # port 0: the router's bound port once started
        self._port_dir: Path | None = None

    @property
    def worker_urls(self) -> list[str]:
        return [w.url for w in self.workers]

    def __enter__(self) -> Stack:
        """`with Stack(spec) as stack:` starts it, and stops whatever started, also on failure."""
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def _spawn(self, name: str, argv: list[str], ready_url: str, env: dict[str, str] | None = None,
               ready_timeout_s: float = READY_TIMEOUT_S,
               reports_ports: bool = False) -> Child:  # fmt: skip
        port_file = None
        if reports_ports:
            if self._port_dir is None:
                self._port_dir = Path(tempfile.mkdtemp(prefix="smetric-launch-"))
            port_file = self._port_dir / f"{name}.json"
            argv = [*argv, "--port-file", str(port_file)]
        log.info("starting %s: %s", name, " ".join(argv))
        child = Child(name, None, ready_url, ready_timeout_s, port_file, argv, env)
        self._popen(child)
        self.children.append(child)
        return child

    def _popen(self, child: Child) -> None:
        full_env = {**os.environ, **child.env} if child.env else None
        child.proc = subprocess.Popen(child.argv, start_new_session=True, env=full_env)
        child.started_at = time.monotonic()

    def start(self) -> None:
        r = self.spec.router
        if r.port and port_in_use(r.host, r.port):
            raise RuntimeError(f"router port {r.host}:{r.port} is already in use (use --port)")
        self.start_workers()
        argv = [sys.executable, "-m", *router_args(self.spec, self.workers)]
        router = self._spawn("router", argv, f"{self.url}/readiness", reports_ports=r.port == 0)
        if router.port_file is not None:
            self.url = f"http://{r.host}:{self._reported(router)['http']}"
            router.ready_url = f"{self.url}/readiness"
        self._wait_ready([router])

    def start_mooncake(self) -> None:
        argv = mooncake_master_argv(self.spec)
        m = self.spec.mooncake
        if argv is None or m is None:
            return
        ready = f"http://{m.host}:{m.metrics_port}/metrics"
        if m.host not in LOCAL_HOSTS:
            print(f"# on {m.host}: start the Mooncake master\n{_shell(argv)}", flush=True)
            self.children.append(Child(MASTER, None, ready))
        else:
            self._spawn(MASTER, list(argv), ready)
        self._wait_ready(self.children[-1:])

    def start_workers(self) -> None:
        self.start_mooncake()
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self._start_workers_once()
                return
            except ChildExited as e:
                if attempt == START_ATTEMPTS or not self._ports_chosen_here():
                    raise
                log.warning(
                    "%s; its ports were chosen free before it bound them and may have been taken "
                    "since: starting the workers again on fresh ports (attempt %d of %d)",
                    e, attempt + 1, START_ATTEMPTS,
                )  # fmt: skip
                self._stop([c for c in self.children if c.proc is not None and c.name != MASTER])
                self.children = [c for c in self.children if c.name == MASTER]

    def _ports_chosen_here(self) -> bool:
        return self.spec.workers.base_port == 0 and any(
            w.local and not w.reports_ports for w in self.workers
        )

    def _start_workers_once(self) -> None:
        self.workers = plan_workers(self.spec)
        started = []
        for w in self.workers:
            ready = f"{w.url}{w.ready_path}"
            if not w.local:
                print(f"# on {w.host}: start {w.name}\n{w.shell()}", flush=True)
                child = Child(w.name, None, ready, w.ready_timeout_s)
                self.children.append(child)
            else:
                check_local_python(w.argv[0])
                child = self._spawn(w.name, list(w.argv), ready, dict(w.env), w.ready_timeout_s,
                                    w.reports_ports)  # fmt: skip
            started.append(child)
        for i, (w, child) in enumerate(zip(self.workers, started, strict=True)):
            if child.port_file is not None:
                ports = self._reported(child)
                host = w.url.rsplit(":", 1)[0]  # http://HOST
                self.workers[i] = w = replace(
                    w, url=f"{host}:{ports['http']}", bootstrap_port=ports.get("bootstrap")
                )
                child.ready_url = f"{w.url}{w.ready_path}"
        self._wait_ready(started)

    def _reported(self, child: Child) -> dict[str, int]:
        """The ports a child started with ports 0 reports, once it has bound them."""
        assert child.proc is not None and child.port_file is not None
        start = time.monotonic()
        while (ports := read_port_file(child.port_file)) is None:
            if child.proc.poll() is not None:
                raise ChildExited(
                    f"{child.name} exited with code {child.proc.returncode} during start-up"
                )
            if time.monotonic() - start > child.ready_timeout_s:
                raise RuntimeError(f"not ready in time: {child.name} reported no ports")
            time.sleep(0.05)
        # a restart binds these again instead of new ones: the router and clients keep its URL
        child.argv = pin_ports(child.argv, ports)
        return ports

    def _wait_ready(self, children: list[Child]) -> None:
        start = time.monotonic()
        pending = list(children)
        while pending:
            for c in list(pending):
                if c.proc is not None and c.proc.poll() is not None:
                    raise ChildExited(
                        f"{c.name} exited with code {c.proc.returncode} during start-up"
                    )
                try:
                    with urllib.request.urlopen(c.ready_url, timeout=PROBE_TIMEOUT_S) as resp:
                        if resp.status == 200:
                            pending.remove(c)
                            log.info("%s ready after %.1f s", c.name, time.monotonic() - start)
                except (urllib.error.URLError, OSError):
                    pass
            late = [c for c in pending if time.monotonic() - start > c.ready_timeout_s]
            if late:
                names = ", ".join(f"{c.name} ({c.ready_url})" for c in late)
                raise RuntimeError(f"not ready in time: {names}")
            if pending:
                time.sleep(0.2)

    def supervise(self) -> None:
        """Restart the local children that died, each after its backoff; call it often."""
        now = time.monotonic()
        for c in self.children:
            if c.proc is None:
                continue
            if c.proc.poll() is None:
                if c.waiting_ready and now >= c.next_ready_poll:
                    self._check_back(c, now)
                continue
            if c.restart_at is None:
                self._schedule_restart(c, now)
            elif now >= c.restart_at:
                self._restart(c)

    def _schedule_restart(self, c: Child, now: float) -> None:
        assert c.proc is not None
        uptime = now - c.started_at
        c.quick_deaths = c.quick_deaths + 1 if uptime < STABLE_S else 1
        delay = restart_delay(c.quick_deaths)
        c.restart_at = now + delay
        c.waiting_ready = False
        log.error("%s (pid %d) exited with code %s after %.1f s; restarting it in %.1f s",
                  c.name, c.proc.pid, c.proc.returncode, uptime, delay)  # fmt: skip
        if c.quick_deaths >= FAILING_AFTER:
            log.error("%s keeps failing: %d exits in a row within %.0f s of starting; retrying "
                      "every %.0f s until it stays up (or Ctrl-C)", c.name, c.quick_deaths,
                      STABLE_S, RESTART_CAP_S)  # fmt: skip

    def _restart(self, c: Child) -> None:
        assert c.proc is not None
        # what is left of its process group (SGLang's scheduler and detokenizer) goes first:
        # it may hold the ports or the GPU
        _killpg(c.proc.pid, signal.SIGKILL)
        c.restarts += 1
        c.restart_at = None
        try:
            self._popen(c)
        except OSError as e:  # the next supervise() schedules another try
            log.error("%s could not be restarted: %s", c.name, e)
            c.started_at = time.monotonic()
            return
        c.waiting_ready, c.next_ready_poll = True, time.monotonic() + READY_POLL_S / 4
        log.warning("restarted %s (restart %d, pid %d): %s", c.name, c.restarts, c.proc.pid,
                    " ".join(c.argv))  # fmt: skip

    def _check_back(self, c: Child, now: float) -> None:
        c.next_ready_poll = now + READY_POLL_S
        try:
            with urllib.request.urlopen(c.ready_url, timeout=PROBE_TIMEOUT_S) as resp:
                ready = resp.status == 200
        except (urllib.error.URLError, OSError):
            ready = False
        if ready:
            c.waiting_ready = False
            log.warning("%s is back: ready %.1f s after its restart", c.name,
                        time.monotonic() - c.started_at)  # fmt: skip

    def stop(self) -> None:
        local = [c for c in self.children if c.proc is not None]
        master = [c for c in local if c.name == MASTER]
        # the master last, once the workers are gone: their Mooncake clients unmount from it
        self._stop([c for c in local if c.name != MASTER])
        self._stop(master)
        if self._port_dir is not None:
            shutil.rmtree(self._port_dir, ignore_errors=True)
            self._port_dir = None

    def _stop(self, local: list[Child]) -> None:
        for c in reversed(local):
            assert c.proc is not None
            if c.proc.poll() is None:
                # the group leader only: SGLang's launcher then stops its scheduler and
                # detokenizer itself (signalling those directly makes it dump crash diagnostics)
                with contextlib.suppress(ProcessLookupError):
                    c.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for c in local:
            assert c.proc is not None
            try:
                c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop on SIGTERM; killing it", c.name)
                _killpg(c.proc.pid, signal.SIGKILL)
                c.proc.wait()
            # SGLang's scheduler and detokenizer share the launcher's group: take stragglers too
            _killpg(c.proc.pid, signal.SIGKILL)


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _shell(argv: tuple[str, ...]) -> str:
    return shlex.join(argv)


def dry_run(spec: ClusterSpec) -> str:
    """Every host's commands, grouped by host, in start order (what --dry-run prints)."""
    workers = plan_workers(spec)
    by_host: dict[str, list[str]] = {}
    master = mooncake_master_argv(spec)
    if master is not None and spec.mooncake is not None:
        by_host.setdefault(spec.mooncake.host, []).append(f"# mooncake-master\n{_shell(master)}")
    for w in workers:
        where = "binds free ports, reported with --port-file" if w.reports_ports else w.url
        by_host.setdefault(w.host, []).append(f"# {w.name} ({_ROLE[w.role]}, {where})\n{w.shell()}")
    router = (sys.executable, "-m", *router_args(spec, workers))
    where = f"{spec.router.host}:{spec.router.port}"
    # the router always runs where the launcher does
    by_host.setdefault("127.0.0.1", []).append(f"# router ({where})\n{_shell(router)}")
    out = []
    for host, cmds in by_host.items():
        where = "this machine" if host in LOCAL_HOSTS else host
        out.append(f"## on {where}\n" + "\n".join(cmds))
    return "\n\n".join(out) + "\n"
