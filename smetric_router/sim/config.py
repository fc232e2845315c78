"""Simulator settings: the cluster, the global tier, the SLO and the measurement window."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from smetric_router.policies.base import PolicyParams


@dataclass(frozen=True, slots=True)
class Slo:
    """TTFT SLO linear in input tokens, fixed TPOT SLO (the paper's §4.1, Bailian's form).

    Defaults: TPOT 30 ms is the paper's. The paper does not publish Bailian's TTFT line, so the
    defaults are derived from the H20 profile: an uncached prompt prefills at ~16.8K tokens/s
    (0.06 ms/token), and the SLO allows twice that (0.12 ms/token) on top of 2 s for queueing and
    a global-tier fetch. A 30K-token prompt thus gets 5.6 s.
    """

    ttft_base_s: float = 2.0
    ttft_per_token_ms: float = 0.12
    tpot_ms: float = 30.0

    def ttft_limit(self, input_len: int) -> float:
        return self.ttft_base_s + self.ttft_per_token_ms * 1e-3 * input_len


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One simulated cluster (DESIGN §6 testbed by default: 32 single-GPU H20 instances).

    gpu_kv_tokens / host_kv_tokens: per instance; None = the profile's recommendation.
    global_ratio: global-tier capacity / the sum of the instances' local capacity (GPU + host
        tiers); inf = fully provisioned (never binds), 0 = no global tier.
    gpus_per_server / server_link_bytes_per_s: global-tier fetches of the instances of one server
        share its NIC (200 Gb/s RDMA, ~25 GB/s) first-come first-served; host -> GPU then crosses
        PCIe at the profile's rate. Writes to the global tier are asynchronous and not charged.
    window_s: the window of imbalance_mean (the paper's Figure 14 uses 30 s).
    session_hints: requests carry their trace session id as an agent's session header would
        (RequestFeatures.session_hint); off by default, as the paper's router has none.
    """

    instances: int = 32
    profile: str = "h20-qwen3-coder-30b-a3b"
    gpu_kv_tokens: int | None = None
    host_kv_tokens: int | None = None
    global_ratio: float = math.inf
    gpus_per_server: int = 8
    server_link_bytes_per_s: float = 25e9
    page_size: int = 16
    chunked_prefill_size: int = 8192
    max_running_requests: int = 256
    params: PolicyParams = field(default_factory=PolicyParams)
    slo: Slo = field(default_factory=Slo)
    window_s: float = 30.0
    seed: int = 0
    session_hints: bool = False

    def __post_init__(self) -> None:
        if self.instances < 1:
            raise ValueError(f"instances must be >= 1, got {self.instances}")
        if not self.global_ratio >= 0:
            raise ValueError(f"global_ratio must be >= 0 or inf, got {self.global_ratio}")
        if self.window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {self.window_s}")
