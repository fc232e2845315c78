"""The router's settings, fixed at start-up."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from smetric_router.policies import PolicyParams
from smetric_router.router.auth import AuthPolicy, bearer
from smetric_router.router.workers import Role, WorkerSpec

CACHE_VIEWS = ("events", "probe")
# Where the global tier's (Mooncake, HiCache L3) hits come from: nowhere, the master's own HTTP
# API (cluster/l3_view.py), or L3 KV events from workers running the fork's patch (patches/).
L3_VIEWS = ("off", "master", "events")
# What to do with an Anthropic `thinking` for workers without a reasoning parser, which refuse it:
# drop it (served as without it), or pass it on for the workers' own 400.
ANTHROPIC_THINKING = ("drop", "reject")


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
    # Other replicas' requests reach a replica's view only through these reports: at 1 s, four
    # replicas placed up to a second of each other's arrivals blind (benchmarks/results/README.md).
    # /v1/loads reads a shared-memory snapshot in SGLang, no scheduler round-trip.
    load_poll_interval_secs: float = 0.2
    health_check_interval_secs: float = 5.0
    health_check_timeout_secs: float = 5.0
    max_body_bytes: int = 32 * 1024 * 1024
    max_retries: int = 2
    kv_events: bool = True  # subscribe to the workers' KV events (off: hits stay 0)
    # KV-event feed hardening: follow a KV-event host a worker's /server_info names
    # even when it is not the worker's own host (off: such a feed is refused).
    trust_kv_endpoints: bool = False
    # Where per-worker cache hits come from: "events" (KV-event index) or "probe" (ask each worker's
    # patched SGLang /smetric/prefix_match per request, see patches/).
    cache_view: str = "events"
    # Count a dispatched request's pages as held by its worker until it ends (plus a grace for
    # its KV events): a follow-up sent while its prefix is still in flight finds its holder.
    inflight_prefixes: bool = True
    probe_timeout_secs: float = 0.05
    l3_view: str = "off"
    mooncake_master_url: str | None = None  # http://host:port of the master's HTTP (metrics) port
    l3_key_prefix: str | None = None  # None: the served model name, as SGLang's MooncakeStore
    l3_tp_rank: int = 0
    l3_budget_secs: float = 0.025
    l3_cache_ttl_secs: float = 30.0
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
    # Replicas of this router on one port (SO_REUSEPORT): each a full, independent router.
    processes: int = 1
    reuse_port: bool = False
    # On SIGTERM/SIGINT, open requests get this long to finish before they are ended.
    shutdown_grace_secs: float = 30.0
    # Upstream hardening. Connections to workers open at once (each a
    # file descriptor); 0 = half the open-file limit. Past it, requests wait for a free one.
    max_upstream_connections: int = 0
    # Retry a request whose worker dropped the connection after it was sent (it may have run).
    retry_on_reset: bool = False
    # Dispatch to the worker's first body byte (queue + prefill; a non-streamed request past it
    # only once its worker also fails health checks), and longest silence between body bytes of
    # a stream; past either the worker is marked failed and the request ends.
    first_byte_timeout_secs: float = 600.0
    stream_idle_timeout_secs: float = 300.0
    # Authentication (router/auth.py). Keys stay out of repr(): a logged config shows no secret.
    api_key: str | None = field(default=None, repr=False)
    admin_api_key: str | None = field(default=None, repr=False)
    worker_api_key: str | None = field(default=None, repr=False)
    forward_authorization: bool = False
    # Request limits: the served context length (None: the smallest the workers report).
    context_length: int | None = None
    # Coding agents: read the session id an agent sends (x-claude-code-session-id,
    # session_id, x-session-affinity, prompt_cache_key...) as a hint the policy may use
    # (features/session_hint.py, policies/session_home.py).
    session_hints: bool = True
    # Anthropic `thinking` for workers without a reasoning parser (ANTHROPIC_THINKING above).
    anthropic_thinking: str = "drop"
    # OpenAI Responses (router/api_responses.py): the key that signs the response ids the
    # router hands out (they name their holder); None: a random one per router, ids die with it.
    response_id_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.page_size is not None and self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.processes < 1:
            raise ValueError(f"processes must be >= 1, got {self.processes}")
        if self.max_upstream_connections < 0:
            raise ValueError(
                f"max_upstream_connections must be >= 0, got {self.max_upstream_connections}"
            )
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.context_length is not None and self.context_length < 1:
            raise ValueError(f"context_length must be >= 1, got {self.context_length}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        for name in (
            "request_timeout_secs",
            "load_poll_interval_secs",
            "health_check_interval_secs",
            "health_check_timeout_secs",
            "pd_handover_timeout_secs",
            "probe_timeout_secs",
            "first_byte_timeout_secs",
            "stream_idle_timeout_secs",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.cache_view not in CACHE_VIEWS:
            raise ValueError(f"cache_view must be one of {CACHE_VIEWS}, got {self.cache_view!r}")
        if self.anthropic_thinking not in ANTHROPIC_THINKING:
            raise ValueError(
                f"anthropic_thinking must be one of {ANTHROPIC_THINKING}, "
                f"got {self.anthropic_thinking!r}"
            )
        if self.l3_view not in L3_VIEWS:
            raise ValueError(f"l3_view must be one of {L3_VIEWS}, got {self.l3_view!r}")
        if self.l3_view == "master" and not self.mooncake_master_url:
            raise ValueError(
                "--l3-view master needs --mooncake-master-url http://HOST:PORT (the master's "
                "--metrics_port, where it serves /batch_query_keys)"
            )
        if self.l3_view == "events" and (self.cache_view != "events" or not self.kv_events):
            raise ValueError("--l3-view events needs the KV-event index (--cache-view events)")
        if self.l3_budget_secs <= 0 or self.l3_cache_ttl_secs < 0 or self.l3_tp_rank < 0:
            raise ValueError("l3_budget_secs must be > 0, l3_cache_ttl_secs and l3_tp_rank >= 0")
        if not 0 <= self.shutdown_grace_secs < float("inf"):
            raise ValueError("shutdown_grace_secs must be >= 0")
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
        for name in ("api_key", "admin_api_key", "worker_api_key"):
            key = getattr(self, name)
            # a key goes into an HTTP header: printable ASCII, no blanks
            if key is not None and (
                not key or any(c.isspace() or not c.isprintable() or not c.isascii() for c in key)
            ):
                raise ValueError(f"{name} must be non-empty printable ASCII without blanks")
        if self.worker_api_key is not None and self.forward_authorization:
            raise ValueError(
                "--worker-api-key and --forward-authorization exclude each other: the workers get "
                "either the router's worker key or the client's own Authorization header"
            )
        if self.response_id_key is not None and len(self.response_id_key) < 16:
            raise ValueError("response_id_key must be at least 16 characters (it signs ids)")
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

    def auth(self) -> AuthPolicy:
        return AuthPolicy(
            self.api_key, self.admin_api_key, self.worker_api_key, self.forward_authorization
        )

    def worker_headers(self) -> dict[str, str]:
        """What the router's own calls to the workers (health, info, loads, flush) carry."""
        return bearer(self.worker_api_key) if self.worker_api_key is not None else {}

    def prefill_params(self) -> PolicyParams:
        """Prefill load counts tokens, so the request-count slack is replaced by a token one."""
        return replace(self.policy_params, overload_slack=self.prefill_overload_slack)
