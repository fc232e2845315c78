"""GET /v1/loads: SGLang 0.5.23's per-DP-rank load entry (entrypoints/v1_loads.py,
managers/load_snapshot.py) built from the engine model's load and the runner's step counters.

What the engine does not model is reported as SGLang reports it for an idle or absent feature:
no prealloc/transfer queues outside PD decode, `utilization` 0.0 (-1 on a prefill instance; the
SLO-based value has no setter in 0.5.23), no speculative or LoRA section. `memory` gives the timing
profile's weights and the emulated KV pool (no CUDA graphs).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

from smetric_router.emulator.config import SGLANG_VERSION, EmulatorConfig
from smetric_router.emulator.runner import EngineRunner
from smetric_router.engine.timing import load_profile

Json = dict[str, Any]
SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})
PROMETHEUS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class InvalidInclude(ValueError):
    """An unknown `include` section; SGLang 0.5.23 lets this escape as a 500."""


def entry(config: EmulatorConfig, runner: EngineRunner, include: set[str] | None) -> Json:
    load = runner.engine.load()
    c = runner.counters
    moments = list(c.decode_moments) if c.decode_moments[0] > 0 else None
    total = load.num_used_tokens + load.num_waiting_uncached_tokens
    core: Json = {
        "timestamp": time.time(),
        "dp_rank": 0,
        "num_running_reqs": load.num_running_reqs,
        "num_waiting_reqs": load.num_waiting_reqs,
        "num_waiting_uncached_tokens": load.num_waiting_uncached_tokens,
        "num_used_tokens": load.num_used_tokens,
        "num_total_tokens": total,  # used + what the waiting requests still need
        "num_active_tokens": total,  # no request waits for a KV transfer inside the engine
        "num_prealloc_ready_tokens": 0,
        "max_total_num_tokens": load.max_total_num_tokens,
        "max_running_requests": load.max_running_requests,
        "token_usage": load.token_usage,
        "gen_throughput": load.gen_throughput,
        "cache_hit_rate": load.cache_hit_rate,
        "utilization": -1.0 if config.role == "prefill" else 0.0,
        "total_prefill_uncached_tokens": load.total_prefill_uncached_tokens,
        "total_prefill_busy_us": c.prefill_busy_us,
        "decode_moments": moments,
    }
    if include is not None and not include <= SECTIONS:
        raise InvalidInclude(
            f"Invalid include sections: {include - SECTIONS}. Valid options: {sorted(SECTIONS)}"
        )
    every = include is None or "all" in include
    if include == {"core"}:
        return core
    model = load_profile(config.engine.profile)["model"]
    sections: dict[str, tuple[str, Json]] = {
        "memory": ("memory", {
            "weight_gb": round(model["weight_bytes"] / 1e9, 3),
            "kv_cache_gb": round(load.max_total_num_tokens * model["kv_bytes_per_token"] / 1e9, 3),
            "graph_gb": 0.0,
            "token_capacity": load.max_total_num_tokens,
        }),
        "disaggregation": ("disagg", {
            "mode": config.role,
            "prefill_bootstrap_queue_reqs": 0,
            "prefill_inflight_queue_reqs": 0,
            "decode_prealloc_queue_reqs": 0,
            "decode_transfer_queue_reqs": 0,
            "decode_retracted_queue_reqs": 0,
            "kv_transfer_speed_gb_s": 0.0,
            "kv_transfer_latency_ms": 0.0,
        }),
        "queues": ("queues", {
            "waiting": load.num_waiting_reqs, "grammar": 0, "paused": 0, "retracted": 0,
            "prealloc_ready": 0,
        }),
    }  # fmt: skip
    for key, (name, section) in sections.items():
        if every or (include is not None and name in include):
            core[key] = section
    return core


def response(entries: list[Json]) -> Json:
    return {
        "timestamp": datetime.now(timezone.utc).isoformat(),
        "version": SGLANG_VERSION,
        "accelerator": "emulated",
        "num_accelerators": 1,
        "loads": entries,
    }


def prometheus(entries: list[Json]) -> str:
    """`format=prometheus`: one gauge per numeric field, sections prefixed (spec, disagg)."""
    prefixes = {"speculative": "spec", "disaggregation": "disagg"}
    samples: dict[str, list[tuple[int, float]]] = {}
    for e in entries:
        rank = e["dp_rank"]
        for key, value in e.items():
            if key == "dp_rank":
                continue
            items = (
                [(f"{prefixes.get(key, key)}_{k}", v) for k, v in value.items()]
                if isinstance(value, dict)
                else [(key, value)]
            )
            for name, v in items:
                if isinstance(v, int | float) and not isinstance(v, bool):
                    samples.setdefault(f"sglang_{name}", []).append((rank, v))
    lines = []
    for name, values in samples.items():
        lines.append(f"# TYPE {name} gauge")
        lines += [f'{name}{{dp_rank="{rank}"}} {v}' for rank, v in values]
    return "\n".join(lines) + "\n"
