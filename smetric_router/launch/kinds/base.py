"""What every worker kind hands the launcher: processes to start, each with its URL and role.

The seam between the launcher and worker kinds: a kind turns a ClusterSpec into WorkerLaunch
plans; the launcher starts, waits for and stops them without knowing what they run. The router
never imports this package (it only ever sees worker URLs).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass

from smetric_router.launch.spec import ClusterSpec

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", ""})


@dataclass(frozen=True, slots=True)
class WorkerLaunch:
    """One process to start: its name, URL, role and full command line."""

    name: str
    url: str
    argv: tuple[str, ...]  # the whole command line, interpreter first
    role: str = "null"  # null (colocated) | prefill | decode
    bootstrap_port: int | None = None  # prefill: where its decode instances fetch KV
    env: tuple[tuple[str, str], ...] = ()  # added to the launcher's environment
    host: str = "127.0.0.1"  # where it runs; not local: printed for the operator, not started
    ready_path: str = "/health"
    ready_timeout_s: float = 60.0
    # Its ports are given as 0: it binds free ones and writes them to `--port-file PATH` (which
    # the launcher appends); url and bootstrap_port hold port 0 until it has reported.
    reports_ports: bool = False

    @property
    def local(self) -> bool:
        return self.host in LOCAL_HOSTS

    def shell(self) -> str:
        """The command as one shell line, environment first (what --dry-run prints)."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env)
        cmd = shlex.join(self.argv)
        return f"{env} {cmd}" if env else cmd


PlanFn = Callable[[ClusterSpec], list[WorkerLaunch]]
