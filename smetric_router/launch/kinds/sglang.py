"""Worker kind `sglang`: real SGLang 0.5.23 servers (`python -m sglang.launch_server`).

On `device: cpu` (this project's tests and CI) the workers run SGLang's own scheduler, radix
cache, HiCache, KV-event publisher and HTTP server over the generated tiny model with random
weights; only CUDA-only primitives are stood in for (smetric_router.sglang_cpu, loaded through
sitecustomize in every SGLang process). On `device: cuda` the command lines are SGLang's as
shipped, for GPU nodes: the launcher runs the local ones and prints the others.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from smetric_router.launch.kinds.base import LOCAL_HOSTS, WorkerLaunch
from smetric_router.launch.ports import port_source
from smetric_router.launch.spec import ClusterSpec, MooncakeSpec, SglangSpec
from smetric_router.launch.tiny_model import ensure_tiny_model

ROOT = Path(__file__).resolve().parents[3]
CPU_SITE = Path(__file__).resolve().parents[2] / "sglang_cpu" / "site"
TINY_MODEL_NAME = "smetric-tiny-qwen3"  # what clients put in "model" for the tiny model


def sglang_python(s: SglangSpec) -> str:
    """The interpreter that has SGLang: the spec's, $SMETRIC_SGLANG_PYTHON, or .venv-sglang."""
    if s.python:
        return s.python
    env = os.environ.get("SMETRIC_SGLANG_PYTHON")
    if env:
        return env
    return str(ROOT / ".venv-sglang" / "bin" / "python")


def check_local_python(python: str) -> None:
    if os.sep in python and not Path(python).exists():
        raise RuntimeError(
            f"no SGLang environment at {python}: run `make sglang` (makes .venv-sglang), "
            "or set sglang.python in the spec / SMETRIC_SGLANG_PYTHON"
        )


def model_path(s: SglangSpec) -> str:
    return str(ensure_tiny_model()) if s.model_path == "tiny" else s.model_path


def _kv_events_config(host_local: bool, events: int, replay: int) -> str:
    # SGLang's publisher connects instead of binding unless told to bind or given a wildcard
    host = "127.0.0.1" if host_local else "*"
    cfg = {"publisher": "zmq", "endpoint": f"tcp://{host}:{events}",
           "replay_endpoint": f"tcp://{host}:{replay}", "bind": True}  # fmt: skip
    return json.dumps(cfg, separators=(",", ":"))


def server_args(
    spec: ClusterSpec, *, host: str, port: int, role: str = "null",
    kv_ports: tuple[int, int] | None = None, bootstrap_port: int | None = None,
) -> list[str]:  # fmt: skip
    """`launch_server`'s arguments for one worker (what SGLang's ServerArgs parser must accept)."""
    s, w = spec.sglang, spec.workers
    local = host in LOCAL_HOSTS
    args = ["--model-path", model_path(s), "--host", "127.0.0.1" if local else "0.0.0.0",
            "--port", str(port), "--page-size", str(w.page_size), "--enable-cache-report",
            "--tp-size", str(s.tp_size)]  # fmt: skip
    if role == "null":
        # previous_response_id, GET and cancel on /v1/responses need the worker's response
        # store (the router sends each to its holder); SGLang refuses it under PD
        args += ["--enable-response-store"]
    served = s.served_model_name or (TINY_MODEL_NAME if s.model_path == "tiny" else "")
    if served:
        args += ["--served-model-name", served]
    if s.device == "cpu":
        args += ["--device", "cpu", "--load-format", "dummy", "--attention-backend",
                 "torch_native", "--disable-cuda-graph", "--sleep-on-idle"]  # fmt: skip
    if s.max_total_tokens:
        args += ["--max-total-tokens", str(s.max_total_tokens)]
    if s.mem_fraction_static:
        args += ["--mem-fraction-static", str(s.mem_fraction_static)]
    if s.metrics:
        args += ["--enable-metrics"]
    if kv_ports is not None:
        args += ["--kv-events-config", _kv_events_config(local, *kv_ports)]
    if s.hicache and role != "decode":
        args += ["--enable-hierarchical-cache", "--hicache-write-policy", "write_through"]
        if s.hicache_size_gb:
            args += ["--hicache-size", f"{s.hicache_size_gb:g}"]
        else:
            args += ["--hicache-ratio", "2"]
        if s.device == "cpu":
            # the CPU stand-ins copy with tensor indexing: direct I/O; Mooncake needs page-first
            layout = "page_first_direct" if s.hicache_storage_backend else "layer_first"
            args += ["--hicache-io-backend", "direct", "--hicache-mem-layout", layout]
        elif s.hicache_storage_backend:
            args += ["--hicache-io-backend", "kernel", "--hicache-mem-layout", "page_first"]
        if s.hicache_storage_backend:
            args += ["--hicache-storage-backend", s.hicache_storage_backend]
            if s.device == "cpu":
                # the default `timeout` policy budgets GPU copy speeds: on CPU an L3 prefetch is
                # cut short and the hit lost; wait for it (a prefix >= 256 tokens is prefetched)
                args += ["--hicache-storage-prefetch-policy", "wait_complete"]
    if role != "null":
        backend = s.transfer_backend or ("mooncake_tcp" if s.device == "cpu" else "mooncake")
        args += ["--disaggregation-mode", role, "--disaggregation-transfer-backend", backend]
        if bootstrap_port is not None:
            args += ["--disaggregation-bootstrap-port", str(bootstrap_port)]
    args += list(w.extra_args)
    if role == "prefill":
        args += list(s.prefill_extra_args)
    elif role == "decode":
        args += list(s.decode_extra_args)
    return args


def mooncake_env(m: MooncakeSpec, host: str) -> dict[str, str]:
    """What SGLang's MooncakeStore reads (sglang/srt/mem_cache/storage/mooncake_store)."""
    env = {
        "MOONCAKE_MASTER": f"{m.host}:{m.rpc_port}",
        "MOONCAKE_TE_META_DATA_SERVER": f"http://{m.host}:{m.http_metadata_port}/metadata",
        "MOONCAKE_PROTOCOL": m.protocol,
        "MOONCAKE_DEVICE": m.device,
        "MOONCAKE_GLOBAL_SEGMENT_SIZE": m.global_segment_size,
        "MOONCAKE_LOCAL_HOSTNAME": "127.0.0.1" if host in LOCAL_HOSTS else host,
        "MOONCAKE_MASTER_METRICS_PORT": str(m.metrics_port),
    }
    if host in LOCAL_HOSTS:
        env["MC_TCP_BIND_ADDRESS"] = "127.0.0.1"
    return env


def worker_env(
    spec: ClusterSpec, host: str, gpus: str | None, role: str = "null"
) -> dict[str, str]:
    s = spec.sglang
    env: dict[str, str] = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if s.device == "cpu":
        # the CPU stand-ins, imported by sitecustomize in every SGLang process; the project
        # itself on the path so a stock .venv-sglang needs nothing installed from it
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(CPU_SITE), str(ROOT), os.environ.get("PYTHONPATH", "")) if p
        )
        env["SMETRIC_SGLANG_CPU"] = "1"
        env["SGLANG_USE_CPU_ENGINE"] = "0"  # 1 selects Intel's CPU sgl-kernel, not installed
    if host in LOCAL_HOSTS:
        env["SGLANG_HOST_IP"] = "127.0.0.1"  # else PD's KV sockets pick the first NIC
        if role != "null":
            env["MC_TCP_BIND_ADDRESS"] = "127.0.0.1"  # Mooncake's TCP transport, for PD's KV
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    if spec.mooncake is not None:
        env.update(mooncake_env(spec.mooncake, host))
    env.update(dict(s.env))
    return env


def _host(s: SglangSpec, role: str, i: int) -> str:
    hosts = s.decode_hosts if role == "decode" and s.decode_hosts else s.hosts
    return hosts[i % len(hosts)] if hosts else "127.0.0.1"


def tokenizer_path(s: SglangSpec) -> str:
    return s.tokenizer_path or model_path(s)


def router_tokenizer_args(spec: ClusterSpec) -> tuple[str, ...]:
    return ("--tokenizer-path", tokenizer_path(spec.sglang))


def plan(spec: ClusterSpec) -> list[WorkerLaunch]:
    w, s, pd = spec.workers, spec.sglang, spec.pd
    roles = ["null"] * w.count if pd is None else ["prefill"] * pd.prefill + ["decode"] * pd.decode
    # per worker: HTTP, KV events, replay, bootstrap (used by prefill only). Real SGLang cannot
    # be given port 0 and report what it bound (it announces only the port it was told, and
    # derives other ports from it under DP attention), so unlike the emulated kind's ports these
    # are chosen free here before it starts.
    ports = port_source(w.base_port, 4 * len(roles), avoid=spec.router.port)
    python = sglang_python(s)
    gpu_next: dict[str, int] = {}
    names = {"null": "worker", "prefill": "prefill", "decode": "decode"}
    seen: dict[str, int] = {}
    out = []
    for role in roles:
        i = seen[role] = seen.get(role, -1) + 1  # this worker's index among its role
        host = _host(s, role, i)
        http, events, replay, bootstrap = (next(ports) for _ in range(4))
        kv = (events, replay) if s.kv_events and role != "decode" else None
        boot = bootstrap if role == "prefill" else None
        gpus = None
        if s.device == "cuda" and s.gpus_per_worker:
            first = gpu_next.get(host, 0)
            gpu_next[host] = first + s.gpus_per_worker
            gpus = ",".join(str(g) for g in range(first, first + s.gpus_per_worker))
        argv = (python, "-m", "sglang.launch_server",
                *server_args(spec, host=host, port=http, role=role, kv_ports=kv,
                             bootstrap_port=boot))  # fmt: skip
        url_host = "127.0.0.1" if host in LOCAL_HOSTS else host
        out.append(WorkerLaunch(
            name=f"{names[role]}-{i}", url=f"http://{url_host}:{http}", argv=argv, role=role,
            bootstrap_port=boot, env=tuple(worker_env(spec, host, gpus, role).items()), host=host,
            ready_timeout_s=s.startup_timeout_s,
        ))  # fmt: skip
    return out


def mooncake_master_argv(spec: ClusterSpec) -> tuple[str, ...] | None:
    """The Mooncake master's command line, when the spec has a global tier."""
    m = spec.mooncake
    if m is None:
        return None
    binary = m.master_binary
    if os.sep not in binary:
        # beside the workers' interpreter: Mooncake's wheel installs it there
        dirs = [Path(sglang_python(spec.sglang)).parent]
        if spec.workers.kind == "emulated":
            dirs.insert(0, Path(sys.executable).parent)
        beside = next((d / binary for d in dirs if (d / binary).exists()), None)
        if beside is not None:
            binary = str(beside)
    bind = m.host if m.host not in LOCAL_HOSTS else "127.0.0.1"
    # The master's periodic status line (a few KB every 10 s) would bury the stack's own log in
    # the console every child shares; the same figures stay on its /metrics.
    return (binary, f"--rpc_address={bind}", f"--rpc_port={m.rpc_port}",
            "--enable_http_metadata_server=true", f"--http_metadata_server_host={bind}",
            f"--http_metadata_server_port={m.http_metadata_port}", f"--metrics_host={bind}",
            f"--metrics_port={m.metrics_port}", "--eviction_high_watermark_ratio=0.95",
            "--enable_metric_reporting=false")  # fmt: skip
