"""The router process: serve a RouterConfig until a signal, drain, and supervise the replicas
that `--processes N` starts on the same port."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING

from aiohttp import web

from smetric_router.core import tracing
from smetric_router.core.port_file import bound_port, write_port_file
from smetric_router.router.api_responses import RESPONSE_ID_KEY_ENV
from smetric_router.router.auth import describe
from smetric_router.router.config import RouterConfig

if TYPE_CHECKING:
    from smetric_router.router.app import RouterState

log = logging.getLogger("smetric_router.router")


def replica_argv(argv: Sequence[str], port: int, sync: Sequence[str] = ()) -> list[str]:
    """The command line of one more replica: the same flags on the bound port, without the
    ones that belong to the first process alone; `sync`: its replica-sync flags."""
    own = {"--processes": 1, "--port": 1, "--port-file": 1, "--prometheus-port": 1}
    out: list[str] = []
    skip = 0
    for arg in argv:
        if skip:
            skip -= 1
            continue
        name = arg.split("=", 1)[0]
        if name in own:
            skip = 0 if "=" in arg else own[name]
            continue
        out.append(arg)
    return [
        sys.executable,
        "-m",
        "smetric_router",
        *out,
        *sync,
        "--port",
        str(port),
        "--reuse-port",
    ]


def sync_endpoints(processes: int) -> tuple[str, list[str]]:
    """A private directory and one ipc endpoint in it per --processes replica (ipc: no port to
    find free, and only this user can connect)."""
    folder = tempfile.mkdtemp(prefix="smetric-replicas-")
    return folder, [f"ipc://{folder}/r{i}" for i in range(processes)]


# After the shutdown grace: how long ended requests get to write their last answer, and how long
# aiohttp then waits for handlers (its default, 60 s twice, made a shutdown take two minutes).
END_BOUND_S = 5.0


async def drain(state: RouterState, grace: float) -> None:
    """Stop taking requests, let the open ones finish within `grace`, then end the rest."""
    d = state.drain
    d.begin()
    log.info("shutting down: %d requests open, %.1f s to finish", d.open, grace)
    if await d.wait_idle(grace):
        log.info("all requests finished")
        return
    log.warning("shutdown grace over: ending %d open requests", d.end_all())
    await d.wait_idle(END_BOUND_S, can_hurry=False)


def _die_with_parent() -> None:
    """A replica goes when the first process goes, even if that one is killed outright."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


# How often a replica joining a shared port says it is still waiting to be ready.
WAIT_LOG_S = 10.0


async def _until_ready(state: RouterState, stop: asyncio.Event) -> None:
    """A replica joining a port others already serve takes no connection before it can route:
    the kernel would give it a share of them at once, and it would answer them 503 while
    another replica's /readiness says 200. Returns early on a stop signal."""
    from smetric_router.router.app import readiness

    loop = asyncio.get_running_loop()
    said = loop.time()
    while not stop.is_set():
        ok, body = readiness(state)
        if ok:
            return
        if loop.time() - said >= WAIT_LOG_S:
            log.info("replica not ready yet (%s): not taking connections", body["status"])
            said = loop.time()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.05)


async def serve(
    config: RouterConfig, port_file: str | None = None, argv: Sequence[str] = ()
) -> None:
    """Run until SIGINT/SIGTERM; with port_file, write the bound ports there once listening.
    With config.processes > 1, also start the other replicas (argv: this process's flags) on
    the port this one bound, and stop them on the way out."""
    from smetric_router.router.app import RUNNER_OPTIONS, build_app, metrics_app
    from smetric_router.router.assemble import make_state
    from smetric_router.router.http_guards import name_server_without_version

    name_server_without_version()

    if config.enable_trace:  # before the app: its server-span middleware is added if on
        tracing.enable(config.otlp_traces_endpoint, config.otlp_service_name)
    sync_dir: str | None = None
    endpoints: list[str] = []
    if config.processes > 1 and config.replica_sync:
        sync_dir, endpoints = sync_endpoints(config.processes)
        config = dataclasses.replace(
            config, replica_sync_bind=endpoints[0], replica_sync_peers=tuple(endpoints)
        )
    state = make_state(config)
    options = {**RUNNER_OPTIONS, "shutdown_timeout": END_BOUND_S}
    runners = [web.AppRunner(build_app(state), **options)]
    replicas: list[subprocess.Popen[bytes]] = []
    if config.prometheus_port is not None:
        runners.append(web.AppRunner(metrics_app(state), **options))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():  # a second signal: no more grace
            state.drain.hurry()
        stop.set()
        # the replicas drain alongside (they sit in their own process group, so a Ctrl-C
        # reaches them once, from here)
        for p in replicas:
            if p.poll() is None:
                p.terminate()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    try:
        await runners[0].setup()
        if config.reuse_port and config.processes == 1:
            await _until_ready(state, stop)
            if stop.is_set():  # stopped before it could route: it never took a connection
                log.info("stopped before ready; the port was never bound")
                return
        await web.TCPSite(
            runners[0], config.host, config.port, reuse_port=config.reuse_port or None
        ).start()
        if len(runners) > 1:
            await runners[1].setup()
            assert config.prometheus_port is not None
            await web.TCPSite(runners[1], config.prometheus_host, config.prometheus_port).start()
        ports = {"http": bound_port(runners[0])}
        if len(runners) > 1:
            ports["prometheus"] = bound_port(runners[1])
        for i in range(1, config.processes):
            sync = (
                ("--replica-sync-bind", endpoints[i], "--replica-sync-peers", *endpoints)
                if endpoints
                else ()
            )
            replicas.append(
                subprocess.Popen(
                    replica_argv(argv, ports["http"], sync),
                    # one key for all replicas: each accepts the response ids the others issue
                    env={**os.environ, RESPONSE_ID_KEY_ENV: state.response_ids.key_text},
                    preexec_fn=_die_with_parent,
                    process_group=0,
                )
            )
        if port_file is not None:
            write_port_file(port_file, ports)
        if config.pd_disaggregation:
            log.info(
                "smetric-router on http://%s:%d, PD: %d prefill (%s), %d decode (%s)",
                config.host,
                ports["http"],
                len(config.prefill),
                config.prefill_policy_name,
                len(config.decode_urls),
                config.decode_policy,
            )
        else:
            log.info(
                "smetric-router on http://%s:%d, policy %s, %d workers",
                config.host,
                ports["http"],
                config.policy,
                len(config.worker_urls),
            )
        if config.discovery_kind is not None:
            log.info("workers also from discovery: %s", config.discovery_kind)
        log.info("auth: %s", describe(state.auth))
        if state.tenants is not None:
            log.info("tenants: %s", state.tenants.describe())
        if replicas:
            log.info("%d more router processes on port %d", len(replicas), ports["http"])
        await stop.wait()
        await drain(state, config.shutdown_grace_secs)
    finally:
        for p in replicas:
            if p.poll() is None:
                p.terminate()
        # they drained alongside this process: a little longer than its own end takes
        deadline = loop.time() + 2 * END_BOUND_S
        while any(p.poll() is None for p in replicas) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        for p in replicas:
            if p.poll() is None:
                log.warning("router process %d did not stop; killing it", p.pid)
                p.kill()
            p.wait()
        for r in reversed(runners):
            await r.cleanup()
        if sync_dir is not None:
            shutil.rmtree(sync_dir, ignore_errors=True)
        tracing.shutdown()  # the last spans go out
