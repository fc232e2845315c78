"""Cluster specs: what the launcher starts, as frozen dataclasses read from one YAML file.

The dataclass defaults are the embedded default stack (launch/emulated.yaml spells out the same
values). Worker kinds own their own section (`sglang:` for real SGLang workers); the router's
settings never depend on the kind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import yaml


@dataclass(frozen=True, slots=True)
class RouterSpec:
    host: str = "127.0.0.1"
    port: int = 30000
    policy: str = "smetric"
    overload: float = 2.0
    hit_ratio: float = 0.5
    # With global_tier: mooncake, where the router's L3 hits come from: master (the master's HTTP
    # API), events (the fork's L3 KV events, patches/), off. Without a global tier: ignored.
    l3_view: str = "master"
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    kind: str = "emulated"  # emulated | sglang
    count: int = 4
    model_name: str = "qwen3-coder-30b-a3b-emulated"  # emulated: the served model name
    base_port: int = 0
    page_size: int = 16
    profile: str = "h20-qwen3-coder-30b-a3b"  # emulated: timing profile
    speedup: float = 1.0  # emulated: timing model speed-up
    # emulated: the chat template workers and router render with. qwen3-coder: the project's
    # Qwen3-Coder-style template (tools in the system turn, tool calls as <tool_call> blocks, as
    # the model the workers stand in for renders them); tokenizer: the bundled tokenizer's own
    # ChatML template (no tools); or a .jinja path.
    chat_template: str = "qwen3-coder"
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SglangSpec:
    """Real SGLang 0.5.23 workers (`workers.kind: sglang`): what `launch_server` is given."""

    model_path: str = "tiny"  # "tiny": the project's generated tiny Qwen3 (random weights)
    served_model_name: str = ""  # empty: smetric-tiny-qwen3 for tiny, else the model path
    device: str = "cpu"  # cpu: CPU stand-ins and flags; cuda: as shipped, on GPU nodes
    python: str = ""  # interpreter with sglang; empty: $SMETRIC_SGLANG_PYTHON, else .venv-sglang
    tp_size: int = 1
    gpus_per_worker: int = 0  # cuda: consecutive CUDA_VISIBLE_DEVICES per worker on its host
    hosts: tuple[str, ...] = ()  # workers' hosts, cycled in start order; empty: this machine
    decode_hosts: tuple[str, ...] = ()  # PD: decode instances' hosts (cycled); empty: `hosts`
    tokenizer_path: str = ""  # the router's --tokenizer-path; empty: the model path
    max_total_tokens: int = 65536  # 0: SGLang sizes the KV pool from memory
    mem_fraction_static: float = 0.0  # 0: SGLang's default
    hicache: bool = True  # HiCache host tier (L2)
    hicache_size_gb: float = 1.0  # host pool per worker; 0 with hicache: --hicache-ratio 2
    hicache_storage_backend: str = ""  # "mooncake": L3 in the spec's mooncake master
    kv_events: bool = True
    metrics: bool = False  # --enable-metrics
    transfer_backend: str = ""  # PD: empty = mooncake_tcp on cpu, mooncake on cuda
    startup_timeout_s: float = 240.0
    env: tuple[tuple[str, str], ...] = ()  # extra environment for every worker
    prefill_extra_args: tuple[str, ...] = ()
    decode_extra_args: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MooncakeSpec:
    """The Mooncake master HiCache's L3 backend (and PD transfer) talk to."""

    host: str = "127.0.0.1"  # where mooncake_master runs (started by the launcher when local)
    rpc_port: int = 50051
    http_metadata_port: int = 8080
    metrics_port: int = 9003
    protocol: str = "tcp"  # tcp | rdma
    device: str = ""  # RDMA device names, e.g. "mlx5_0,mlx5_1"; empty for tcp
    global_segment_size: str = "1gb"  # what each worker contributes to the store ("Ngb" or bytes)
    master_binary: str = "mooncake_master"  # empty/absent: next to the SGLang interpreter


@dataclass(frozen=True, slots=True)
class PdSpec:
    """PD disaggregation: prefill and decode instances instead of workers.count colocated ones;
    router.policy becomes the prefill policy."""

    prefill: int = 4
    decode: int = 2
    transfer_gbps: float = 200.0  # emulated: the modelled prefill -> decode KV link
    decode_kv_timeout_secs: float = 300.0  # emulated
    decode_policy: str = ""  # the router's --decode-policy; empty: the router's default
    prefill_extra_args: tuple[str, ...] = ()
    decode_extra_args: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    router: RouterSpec = field(default_factory=RouterSpec)
    workers: WorkerSpec = field(default_factory=WorkerSpec)
    pd: PdSpec | None = None  # None: colocated workers
    sglang: SglangSpec = field(default_factory=SglangSpec)
    mooncake: MooncakeSpec | None = None  # None: no global tier


KINDS = ("emulated", "sglang")
SECTIONS = {"router", "workers", "pd", "sglang", "mooncake", "global_tier"}


def _value(key: str, v: Any) -> Any:
    """YAML's shapes for the few fields written more loosely than their types: an env mapping,
    and command-line lists whose numbers YAML reads as numbers (`[--gpu-kv-tokens, 50000]`)."""
    if key == "env" and isinstance(v, dict):
        return [[str(k), str(x)] for k, x in v.items()]
    if key.endswith("extra_args") or key.endswith("hosts"):
        if not isinstance(v, list):
            raise ValueError(f"{key}: expected a list")
        return [str(a) for a in v]
    return v


def _section(cls: type[Any], raw: object, where: str) -> Any:
    """One section decoded strictly: unknown keys and wrong types (`speedup: fast`,
    `port: "30000"`, `count: "4"`) are errors naming the field; an int is a valid float."""
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(raw).__name__}")
    known = set(cls.__dataclass_fields__)
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(known)}")
    fields = {k: _value(k, v) for k, v in raw.items()}
    try:
        return msgspec.convert(fields, cls, strict=True)
    except msgspec.ValidationError as e:
        # msgspec names the field from the section's root, `$`: name the section instead
        section = where.rsplit(": ", 1)[-1]
        raise ValueError(f"{where}: {str(e).replace('`$', f'`{section}')}") from None


def load_spec(path: Path) -> ClusterSpec:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"cannot read cluster spec {path}: {e}") from e
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping with 'router' and 'workers'")
    unknown = set(raw) - SECTIONS
    if unknown:
        raise ValueError(f"{path}: unknown sections {sorted(unknown)}; known: {sorted(SECTIONS)}")
    tier = raw.get("global_tier", "none")
    if tier not in ("none", "mooncake"):
        raise ValueError(f"{path}: global_tier must be 'none' or 'mooncake', not {tier!r}")
    if tier == "none" and "mooncake" in raw:
        raise ValueError(f"{path}: a mooncake section needs global_tier: mooncake")
    spec = ClusterSpec(
        router=_section(RouterSpec, raw.get("router"), f"{path}: router"),
        workers=_section(WorkerSpec, raw.get("workers"), f"{path}: workers"),
        pd=None if "pd" not in raw else _section(PdSpec, raw["pd"], f"{path}: pd"),
        sglang=_section(SglangSpec, raw.get("sglang"), f"{path}: sglang"),
        mooncake=None
        if tier == "none"
        else _section(MooncakeSpec, raw.get("mooncake"), f"{path}: mooncake"),
    )
    if spec.pd is not None and isinstance(raw.get("workers"), dict) and "count" in raw["workers"]:
        raise ValueError(f"{path}: workers.count does not apply with pd; set pd.prefill/decode")
    if "sglang" in raw and spec.workers.kind != "sglang":
        raise ValueError(f"{path}: an sglang section needs workers.kind: sglang")
    try:
        validate(spec)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e
    return spec


def validate(spec: ClusterSpec) -> None:
    w, s = spec.workers, spec.sglang
    if w.kind not in KINDS:
        raise ValueError(f"workers.kind {w.kind!r} is unknown; known: {', '.join(KINDS)}")
    if w.count < 1:
        raise ValueError("workers.count must be >= 1")
    if spec.router.l3_view not in ("off", "master", "events"):
        raise ValueError(
            f"router.l3_view must be off, master or events, not {spec.router.l3_view!r}"
        )
    if spec.pd is not None and (spec.pd.prefill < 1 or spec.pd.decode < 1):
        raise ValueError("pd.prefill and pd.decode must be >= 1")
    if s.device not in ("cpu", "cuda"):
        raise ValueError(f"sglang.device must be cpu or cuda, not {s.device!r}")
    if s.hicache_storage_backend not in ("", "mooncake"):
        raise ValueError("sglang.hicache_storage_backend must be empty or 'mooncake'")
    if s.hicache_storage_backend == "mooncake" and spec.mooncake is None:
        raise ValueError("sglang.hicache_storage_backend: mooncake needs global_tier: mooncake")
