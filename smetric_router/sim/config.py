"""Simulator settings: the cluster, the global tier, the SLO and the measurement window, each
with the flag of `python -m smetric_router.sim` that sets it (core/flags.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from smetric_router.core.flags import Flag, nested, option
from smetric_router.engine.timing import PROFILES_DIR
from smetric_router.policies.base import PolicyParams

TIER_MODES = ("paper", "hicache")
PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")
FOLLOW_UPS = ("trace", "after-reply", "on-reply")


def _profiles() -> list[str]:
    return sorted(f.stem for f in PROFILES_DIR.glob("*.json"))


@dataclass(frozen=True, slots=True)
class Slo:
    """TTFT SLO linear in input tokens, fixed TPOT SLO (the paper's §4.1, Bailian's form).

    Defaults: TPOT 30 ms is the paper's. The paper does not publish Bailian's TTFT line, so the
    defaults are derived from the H20 profile: an uncached prompt prefills at ~16.8K tokens/s
    (0.06 ms/token), and the SLO allows twice that (0.12 ms/token) on top of 2 s for queueing and
    a global-tier fetch. A 30K-token prompt thus gets 5.6 s.
    """

    ttft_base_s: float = option(
        2.0,
        Flag(
            "--slo-ttft-base-s",
            "TTFT SLO: this many seconds plus --slo-ttft-per-token-ms per input token",
        ),
    )
    ttft_per_token_ms: float = option(
        0.12, Flag("--slo-ttft-per-token-ms", "TTFT SLO: milliseconds per input token")
    )
    tpot_ms: float = option(30.0, Flag("--slo-tpot-ms", "TPOT SLO, milliseconds"))

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
    follow_ups: when a request whose parent is in the trace arrives. "trace": at its own time
        in the trace, whatever became of its parent (open loop, as the paper's replays);
        "after-reply": at its trace time, but not before its parent's reply has ended (an agent
        waits for the reply, then for whatever its trace gap still leaves); "on-reply": as soon
        as its parent's reply ends (SGLang bench_serving's multi-turn client: no gap at all).
        Requests whose parent is not in the trace arrive at their trace time in every mode.
    session_hints: requests carry their trace session id as an agent's session header would
        (RequestFeatures.session_hint); off by default, as the paper's router has none.
    """

    instances: int = option(32, Flag("--instances", "serving instances (GPUs)"))
    profile: str = option(
        "h20-qwen3-coder-30b-a3b",
        Flag("--profile", "timing profile of an instance (engine/profiles)", choices=_profiles),
    )
    gpu_kv_tokens: int | None = option(
        None,
        Flag(
            "--gpu-kv-tokens",
            "GPU-tier KV capacity per instance, tokens",
            default_text="the profile's",
        ),
    )
    host_kv_tokens: int | None = option(
        None,
        Flag(
            "--host-kv-tokens",
            "--tier-mode hicache: the L2 host tier per instance, tokens; paper mode has none",
            default_text="the profile's",
        ),
    )
    global_ratio: float = math.inf  # the CLI's --global-ratio sweeps it
    tier_mode: str = option(
        "paper",
        Flag(
            "--tier-mode",
            "paper: GPU tier + global tier over RDMA (no private host tier; a global fetch "
            "stalls the batch, as vLLM + LMCache); hicache: SGLang HiCache, L1 GPU + L2 host "
            "(local) + L3 Mooncake prefetched while the request is queued",
            choices=TIER_MODES,
        ),
    )
    gpus_per_server: int = option(
        8, Flag("--gpus-per-server", "instances per server (they share its NICs)")
    )
    nics_per_server: int = option(
        1,
        Flag(
            "--nics-per-server",
            "NICs per server (of --gpus-per-server instances); the server's global-tier reads "
            "and writes share them",
        ),
    )
    nic_bytes_per_s: float = option(
        21.75e9,
        Flag(
            "--nic-gbytes-per-s",
            "achieved GB/s per NIC (21.75: Mooncake's 87 GB/s over 4 x 200 Gbps RoCE)",
            scale=1e9,
        ),
    )
    network_fraction: float | None = option(
        None,
        Flag(
            "--network-fraction",
            "share of a global-tier page's bytes that crosses the network",
            default_text="1 - 1/servers, pages spread evenly over the servers' memory",
        ),
    )
    fetch_overhead_s: float = option(
        1.5e-3,
        Flag(
            "--fetch-overhead-ms",
            "fixed cost per global-tier fetch, ms (LMCache lookups take 1-2 ms)",
            scale=1e-3,
        ),
    )
    prefetch_policy: str = option(
        "timeout",
        Flag(
            "--prefetch-policy",
            "--tier-mode hicache: when an L3 prefetch stops (SGLang "
            "--hicache-storage-prefetch-policy: take what arrived / wait for all / wait up to "
            "1 s + 0.25 s per 1K tokens)",
            choices=PREFETCH_POLICIES,
        ),
    )
    page_size: int = 16
    chunked_prefill_size: int = 8192
    max_running_requests: int = 256
    # the router's flags of the policies the simulator models
    params: PolicyParams = field(
        default_factory=PolicyParams,
        metadata=nested(only=("overload", "move_cost_ratio", "hit_ratio", "bailian_lambda")),
    )
    slo: Slo = field(default_factory=Slo, metadata=nested())
    window_s: float = option(30.0, Flag("--window-s", "window of imbalance_mean, seconds"))
    seed: int = option(0, Flag("--seed", "seeds tie-breaks and random policies"))
    session_hints: bool = option(
        False,
        Flag(
            "--session-hints",
            "requests carry their trace session id as a coding agent's session header would "
            "(the router's policies read it as a hint: session-hint-fallback)",
        ),
    )
    follow_up_priority: int = option(
        0,
        Flag(
            "--follow-up-priority",
            "the router's --follow-up-priority: follow-ups ask for this priority and every "
            "instance orders its queue by it (SGLang's --enable-priority-scheduling); 0 = off",
        ),
    )
    max_concurrent_requests: int = option(
        0,
        Flag(
            "--max-concurrent-requests",
            "the router's admission cap: at most this many requests in flight over all "
            "instances; the others wait at the router and are placed when its order admits "
            "them (follow-ups first; sim/admission.py says what is left out). 0 = off. "
            "Colocated only",
        ),
    )
    queue_first_turn_ceiling_s: float = option(
        5.0,
        Flag(
            "--queue-first-turn-ceiling-secs",
            "with --max-concurrent-requests: a first turn that has waited this long at the "
            "router goes before follow-ups (the router's flag)",
        ),
    )
    queue_session_grace_s: float = option(
        0.0,
        Flag(
            "--queue-session-grace-secs",
            "with --max-concurrent-requests: the slot a request frees is kept this long for the "
            "follow-up continuing its conversation (the router's flag); 0 = not kept",
        ),
    )

    queue_timeout_s: float = option(
        60.0,
        Flag(
            "--queue-timeout-secs",
            "with --max-concurrent-requests: a request that has waited this long at the router "
            "is refused, never placed (the router's flag and default; it answers 429); with "
            "--follow-ups on-reply its conversation's next turn is sent then. inf = it waits "
            "until admitted",
        ),
    )

    follow_ups: str = option(
        "trace",
        Flag(
            "--follow-ups",
            "when a follow-up arrives: at its trace time (trace, open loop); at its trace time "
            "but not before its parent's reply ends (after-reply); when that reply ends "
            "(on-reply, as bench_serving's multi-turn client sends them). Colocated only",
            choices=FOLLOW_UPS,
        ),
    )

    def __post_init__(self) -> None:
        if self.instances < 1:
            raise ValueError(f"instances must be >= 1, got {self.instances}")
        if not self.global_ratio >= 0:
            raise ValueError(f"global_ratio must be >= 0 or inf, got {self.global_ratio}")
        if self.window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {self.window_s}")
        if self.tier_mode not in TIER_MODES:
            raise ValueError(f"tier_mode must be one of {TIER_MODES}, got {self.tier_mode!r}")
        if self.follow_ups not in FOLLOW_UPS:
            raise ValueError(f"follow_ups must be one of {FOLLOW_UPS}, got {self.follow_ups!r}")
        if self.max_concurrent_requests < 0 or self.queue_first_turn_ceiling_s < 0:
            raise ValueError("max_concurrent_requests and queue_first_turn_ceiling_s must be >= 0")
        if not self.queue_timeout_s > 0:
            raise ValueError(f"queue_timeout_s must be > 0, got {self.queue_timeout_s}")
        if not self.queue_session_grace_s >= 0:
            raise ValueError(
                f"queue_session_grace_s must be >= 0, got {self.queue_session_grace_s}"
            )
        if self.queue_session_grace_s and not self.max_concurrent_requests:
            raise ValueError("queue_session_grace_s keeps slots of max_concurrent_requests")
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
