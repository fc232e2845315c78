"""The router's settings, fixed at start-up."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from smetric_router.policies import PolicyParams
from smetric_router.router.workers import Role, WorkerSpec

CACHE_VIEWS = ("events", "probe")


@dataclass(frozen=True, slots=True)
class RouterConfig:
    worker_urls: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 30000
    policy: str = "smetric"
    policy_params: PolicyParams = field(default_factory=PolicyParams)
    prometheus_port: int | None = None
    prometheus_host: str = "127.0.0.1"
    log_level: str = "info"
    request_timeout_secs: float = 1800.0
    tokenizer_path: str | None = None  # None: the committed tokenizer
    chat_template: str | None = None  # a .jinja file; None: the tokenizer directory's template
    page_size: int | None = None  # None: read from the workers' /server_info
    load_poll_interval_secs: float = 1.0
    health_check_interval_secs: float = 5.0
    health_check_timeout_secs: float = 5.0
    max_body_bytes: int = 32 * 1024 * 1024
    max_retries: int = 2
    kv_events: bool = True  # subscribe to the workers' KV events (off: hits stay 0)
    # Where per-worker cache hits come from: "events" (KV-event index) or "probe" (ask each worker's
    # patched SGLang /smetric/prefix_match per request, see patches/).
    cache_view: str = "events"
    probe_timeout_secs: float = 0.05
    # PD disaggregation: prefill (URL, bootstrap port or None = discover) and decode instances.
    pd_disaggregation: bool = False
    prefill: tuple[tuple[str, int | None], ...] = ()
    decode_urls: tuple[str, ...] = ()
    prefill_policy: str | None = None  # None: `policy`
    decode_policy: str = "least_tokens"
    # SMetric's overload slack for prefill instances, whose load is unprefilled tokens.
    prefill_overload_slack: float = 4096.0
    # Dispatch until the prefill is done (its reply ended, or decode's first byte) at most this.
    pd_handover_timeout_secs: float = 300.0

    def __post_init__(self) -> None:
        if self.page_size is not None and self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        for name in (
            "request_timeout_secs",
            "load_poll_interval_secs",
            "health_check_interval_secs",
            "health_check_timeout_secs",
            "pd_handover_timeout_secs",
            "probe_timeout_secs",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.cache_view not in CACHE_VIEWS:
            raise ValueError(f"cache_view must be one of {CACHE_VIEWS}, got {self.cache_view!r}")
        if self.prefill_overload_slack < 0:
            raise ValueError("prefill_overload_slack must be >= 0")
        if self.pd_disaggregation:
            if self.worker_urls:
                raise ValueError(
                    "--worker-urls cannot be mixed with --pd-disaggregation: give the workers "
                    "as --prefill URL [BOOTSTRAP_PORT] and --decode URL"
                )
            if not self.prefill or not self.decode_urls:
                raise ValueError(
                    "--pd-disaggregation needs at least one --prefill URL and one --decode URL"
                )
        elif self.prefill or self.decode_urls or self.prefill_policy is not None:
            raise ValueError("--prefill, --decode and --prefill-policy need --pd-disaggregation")
        self.worker_specs()  # URL and port checks fail here, at start-up

    @property
    def prefill_policy_name(self) -> str:
        return self.prefill_policy or self.policy

    def worker_specs(self) -> list[WorkerSpec]:
        return (
            [WorkerSpec(u) for u in self.worker_urls]
            + [WorkerSpec(u, Role.PREFILL, port) for u, port in self.prefill]
            + [WorkerSpec(u, Role.DECODE) for u in self.decode_urls]
        )

    def prefill_params(self) -> PolicyParams:
        """Prefill load counts tokens, so the request-count slack is replaced by a token one."""
        return replace(self.policy_params, overload_slack=self.prefill_overload_slack)
