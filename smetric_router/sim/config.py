"""Simulator settings: the cluster, the global tier, the SLO and the measurement window."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from smetric_router.policies.base import PolicyParams

TIER_MODES = ("paper", "hicache")
PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")


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
    tier_mode: "paper" (the paper's vLLM + LMCache stack, the default for reproductions): a GPU
        tier per instance and a global tier over RDMA that includes the servers' CPU memory; no
        private host tier (host_kv_tokens is forced to 0); a global-tier fetch stalls the batch
        the request is admitted in (LMCache's synchronous loading).
        "hicache": SGLang HiCache: L1 GPU + L2 private host tier (host_kv_tokens, counted as a
        local hit) + L3 global (Mooncake); L3 pages are prefetched while the request waits in the
        queue, and at admission it takes what prefetch_policy says (sim/tiers.py).
    global_ratio: global-tier capacity / the instances' total GPU KV (both modes; the paper sizes
        the global tier against the local tier); inf = fully provisioned (never binds), 0 = none.
    gpus_per_server / nics_per_server / nic_bytes_per_s: the instances of one server share its
        NICs (nics_per_server x nic_bytes_per_s), one FIFO per server carrying the network part of
        its global-tier reads and writes (sim/tiers.py). 21.75 GB/s per 200 Gb/s NIC: Mooncake's
        transfer engine reaches 87 GB/s over 4 x 200 Gbps RoCE (kvcache-ai/Mooncake README,
        "Transfer Engine"; doc/en/transfer-engine.md benchmark), 87 / 4 = 21.75.
    network_fraction: the share of a global-tier page's bytes that crosses the network; None =
        1 - 1/servers (a page lives in any server's CPU memory with equal chance; the rest is in
        the local server's memory and only crosses PCIe).
    fetch_overhead_s: fixed cost per global-tier fetch (lookup + transfer setup). 1.5 ms: the
        middle of the 1-2 ms LMCache lookups cost (LMCache's min_retrieve_tokens exists
        because small retrieves cost more than recomputing them, docs.lmcache.ai performance
        tuning). Modelled, not measured.
    prefetch_policy: hicache mode: "best_effort" | "wait_complete" | "timeout" (SGLang
        --hicache-storage-prefetch-policy, default "timeout").
    window_s: the window of imbalance_mean (the paper's Figure 14 uses 30 s).
    session_hints: requests carry their trace session id as an agent's session header would
        (RequestFeatures.session_hint); off by default, as the paper's router has none.
    """

    instances: int = 32
    profile: str = "h20-qwen3-coder-30b-a3b"
    gpu_kv_tokens: int | None = None
    host_kv_tokens: int | None = None
    global_ratio: float = math.inf
    tier_mode: str = "paper"
    gpus_per_server: int = 8
    nics_per_server: int = 1
    nic_bytes_per_s: float = 21.75e9
    network_fraction: float | None = None
    fetch_overhead_s: float = 1.5e-3
    prefetch_policy: str = "timeout"
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
        if self.tier_mode not in TIER_MODES:
            raise ValueError(f"tier_mode must be one of {TIER_MODES}, got {self.tier_mode!r}")
        if self.prefetch_policy not in PREFETCH_POLICIES:
            raise ValueError(
                f"prefetch_policy must be one of {PREFETCH_POLICIES}, got {self.prefetch_policy!r}"
            )
        if self.gpus_per_server < 1 or self.nics_per_server < 1:
            raise ValueError("gpus_per_server and nics_per_server must be >= 1")
        if not self.nic_bytes_per_s > 0:
            raise ValueError(f"nic_bytes_per_s must be > 0, got {self.nic_bytes_per_s}")
        if self.network_fraction is not None and not 0 <= self.network_fraction <= 1:
            raise ValueError(f"network_fraction must be in [0, 1], got {self.network_fraction}")
        if not self.fetch_overhead_s >= 0:
            raise ValueError(f"fetch_overhead_s must be >= 0, got {self.fetch_overhead_s}")

    @property
    def servers(self) -> int:
        return -(-self.instances // self.gpus_per_server)

    @property
    def server_link_bytes_per_s(self) -> float:
        """One server's NIC budget, shared by its instances."""
        return self.nics_per_server * self.nic_bytes_per_s

    @property
    def net_fraction(self) -> float:
        """network_fraction, or derived: 1 - 1/servers."""
        if self.network_fraction is not None:
            return self.network_fraction
        return 1.0 - 1.0 / self.servers
