"""The router's settings, fixed at start-up."""

from __future__ import annotations

from dataclasses import dataclass, field

from smetric_router.policies import PolicyParams


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
    page_size: int | None = None  # None: read from the workers' /server_info
    load_poll_interval_secs: float = 1.0
    health_check_interval_secs: float = 5.0
    health_check_timeout_secs: float = 5.0
    max_body_bytes: int = 32 * 1024 * 1024
    max_retries: int = 2
    kv_events: bool = True  # subscribe to the workers' KV events (off: hits stay 0)

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
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
