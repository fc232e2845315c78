"""Worker kind `emulated`: the emulated SGLang worker (smetric_router.emulator), a test and
benchmark tool with a modelled H20 engine, started with this interpreter."""

from __future__ import annotations

import sys

from smetric_router.launch.kinds.base import WorkerLaunch
from smetric_router.launch.ports import port_source
from smetric_router.launch.spec import ClusterSpec


def plan(spec: ClusterSpec) -> list[WorkerLaunch]:
    """The workers of a spec, with their ports: consecutive from workers.base_port, else free."""
    w, pd = spec.workers, spec.pd
    n_ports = 3 * w.count if pd is None else 4 * pd.prefill + pd.decode
    ports = port_source(w.base_port, n_ports, avoid=spec.router.port)

    def port() -> int:
        return next(ports)

    python = (sys.executable, "-m", "smetric_router.emulator")
    common = ("--host", "127.0.0.1", "--model-name", w.model_name, "--page-size",
              str(w.page_size), "--profile", w.profile, "--speedup", str(w.speedup))  # fmt: skip

    def kv_events() -> tuple[str, ...]:
        return ("--kv-events-port", str(port()), "--kv-events-replay-port", str(port()))

    out = []
    if pd is None:
        for i in range(w.count):
            http = port()
            argv = (*python, "--port", str(http), *common, *kv_events(), *w.extra_args)
            out.append(WorkerLaunch(f"worker-{i}", f"http://127.0.0.1:{http}", argv))
        return out
    for i in range(pd.prefill):
        http = port()
        events = kv_events()
        bootstrap = port()
        argv = (*python, "--port", str(http), *common, *events,
                "--role", "prefill", "--disaggregation-bootstrap-port", str(bootstrap),
                *w.extra_args, *pd.prefill_extra_args)  # fmt: skip
        url = f"http://127.0.0.1:{http}"
        out.append(WorkerLaunch(f"prefill-{i}", url, argv, "prefill", bootstrap))
    for i in range(pd.decode):
        # no KV events: a decode instance's cache is not what the router routes by
        http = port()
        argv = (*python, "--port", str(http), *common, "--role", "decode",
                "--transfer-gbps", str(pd.transfer_gbps),
                "--decode-kv-timeout-secs", str(pd.decode_kv_timeout_secs),
                *w.extra_args, *pd.decode_extra_args)  # fmt: skip
        out.append(WorkerLaunch(f"decode-{i}", f"http://127.0.0.1:{http}", argv, "decode"))
    return out
