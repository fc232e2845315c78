"""The router's settings, fixed at start-up, and the flags that set them.

Each field declares its own command-line flag (core/flags.py): `smetric-router`'s parser, its
--help and docs/router-flags.md are generated from these declarations.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from smetric_router.admission.gate import AdmissionConfig
from smetric_router.admission.tenants import TenantTable, load_tenants
from smetric_router.breaker.state import BreakerConfig
from smetric_router.cluster.inflight import GRACE_S
from smetric_router.core.flags import Flag, nested, option
from smetric_router.discovery.pods import BOOTSTRAP_ANNOTATION
from smetric_router.discovery.selectors import LabelSelector, SelectorError, parse_selector
from smetric_router.policies import PolicyParams, policy_names
from smetric_router.policies.base import L3_FLAG_GROUP
from smetric_router.router.api_responses import RESPONSE_ID_KEY_ENV
from smetric_router.router.auth import AuthPolicy, bearer
from smetric_router.router.workers import Role, WorkerSpec

if TYPE_CHECKING:
    from smetric_router.discovery.register import Settings as DiscoverySettings

CACHE_VIEWS = ("events", "probe")
# Where the global tier's (Mooncake, HiCache L3) hits come from: nowhere, the master's own HTTP
# API (cluster/l3_view.py), or L3 KV events from workers running the fork's patch (patches/).
L3_VIEWS = ("off", "master", "events")
# What to do with an Anthropic `thinking` for workers without a reasoning parser, which refuse it:
# drop it (served as without it), or pass it on for the workers' own 400.
ANTHROPIC_THINKING = ("drop", "reject")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# Where workers can come from besides the command line and POST /workers (discovery/).
DISCOVERY_PROVIDERS = ("kubernetes", "file")
_NAMESPACE_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")

# SGLang takes a signed 64-bit priority (its tokenizer manager refuses others)
PRIORITY_RANGE = range(-(1 << 63), 1 << 63)

# Keys are read from these when the flag is absent: a command line is visible to every local
# user (ps), the environment is not.
API_KEY_ENV = "SMETRIC_API_KEY"
ADMIN_API_KEY_ENV = "SMETRIC_ADMIN_API_KEY"
WORKER_API_KEY_ENV = "SMETRIC_WORKER_API_KEY"

# The flags' argument groups (title -> what --help says of them), in --help's order; flags
# without a group are listed first.
PD = "PD disaggregation"
LIFECYCLE = "lifecycle"
L3 = L3_FLAG_GROUP
UPSTREAM = "connections to workers"
AUTH = "authentication"
RESPONSES = "OpenAI Responses"
LIMITS = "request limits"
AGENTS = "coding agents"
DISCOVERY = "worker discovery"
TRACING = "tracing"
ADMISSION = "admission control"
BREAKER = "circuit breaking"
REPLICAS = "router replicas"
FLAG_GROUPS = {
    PD: "prefill and decode on separate SGLang instances (as sglang_router)",
    LIFECYCLE: "how the router stops",
    L3: "Mooncake as HiCache's L3: which prompt pages any worker can load from the shared store",
    UPSTREAM: "bounds, timeouts and retries of the forwarded requests",
    AUTH: "Clients send keys as 'Authorization: Bearer KEY' (the openai client's api_key). "
    "/health, /liveness, /readiness and /metrics stay open, for probes and Prometheus. "
    "Request bodies must be sent as 'Content-Type: application/json' (else 415).",
    RESPONSES: "/v1/responses ids the router hands out name the worker that stores the response, "
    "signed, so previous_response_id, GET and cancel reach it without a table.",
    LIMITS: "what the router refuses (400) before a worker sees it",
    ADMISSION: "requests wait at the router while the cluster, or their worker, has no room; "
    "follow-ups of running sessions go first (docs/admission.md). Off unless "
    "--max-concurrent-requests or --max-queued-requests-per-worker is set",
    BREAKER: "a worker whose requests keep failing (refused connections, 5xx, timeouts, "
    "broken streams; not 4xx, not clients that go away) takes no new requests for a cool-down, "
    "then a few real requests as probes; separate from the health check: a worker can pass "
    "/health and still be open (docs/production.md#circuit-breaking). On by default with "
    "smg's defaults: ten failures in a row are rare on a worker that works, and retries would "
    "otherwise pay a failed round trip to it on every request until it recovers",
    AGENTS: "what the router reads from agents' requests",
    REPLICAS: "replicas publish what they have in flight to each worker to each other (ZeroMQ "
    "PUB/SUB, a few ms old), so that every replica sees the others' requests before the "
    "workers' next load report does, and what they let through of the rate limits, so that "
    "tenants' limits hold across replicas as for one router. --processes replicas do it over "
    "ipc on their own; replicas on other hosts are given --replica-sync-bind and "
    "--replica-sync-peers (docs/deploy.md#scaling-the-router-tier)",
    DISCOVERY: "workers from Kubernetes pods or a file, added and removed as they come and go, "
    "by the same path as POST/DELETE /workers (flag names as sglang_router's); workers given "
    "with --worker-urls, --prefill or --decode stay as given: discovery only removes what it "
    "added (docs/kubernetes.md)",
    TRACING: "OpenTelemetry traces over OTLP, with SGLang 0.5.23's flags; the exporter protocol "
    "comes from OTEL_EXPORTER_OTLP_TRACES_PROTOCOL as in SGLang: grpc (default; the endpoint is "
    "host:port) or http/protobuf (the endpoint is the full http://host:port/v1/traces URL). "
    "Workers started with --enable-trace join the router's trace of each request (traceparent). "
    "Needs the `trace` extra (docs/observing.md#tracing)",
}


def prefill_specs(given: list[list[str]]) -> tuple[tuple[str, int | None], ...]:
    """--prefill URL [BOOTSTRAP_PORT|none], each use -> (URL, port or None = discover)."""
    out: list[tuple[str, int | None]] = []
    for item in given:
        if len(item) > 2:
            raise ValueError(f"--prefill takes URL [BOOTSTRAP_PORT|none], got {' '.join(item)}")
        port = item[1] if len(item) == 2 else "none"
        if port.lower() == "none":
            out.append((item[0], None))
        elif port.isdigit():
            out.append((item[0], int(port)))
        else:
            raise ValueError(f"--prefill {item[0]}: bootstrap port must be a number or 'none'")
    return tuple(out)


@dataclass(frozen=True, slots=True)
class RouterConfig:
    host: str = option("127.0.0.1", Flag("--host", "address the router listens on"))
    port: int = option(
        30000, Flag("--port", "port of the router's HTTP API; 0 = any free port (see --port-file)")
    )
    # Replicas of this router on one port (SO_REUSEPORT): each a full, independent router.
    processes: int = option(
        1,
        Flag(
            "--processes",
            "serve with N router processes on one port (SO_REUSEPORT, Linux): the kernel spreads "
            "connections over them; each is a full replica of this stateless router (its own "
            "worker view, KV-event subscriptions and /metrics; --prometheus-port stays with the "
            "first; GET /health says which pid answered); they stop with the first process",
            metavar="N",
        ),
    )
    # Set on the replicas the first process starts (and whenever processes > 1).
    reuse_port: bool = option(False, Flag("--reuse-port", "bind the port shared", hidden=True))
    replica_sync: bool = option(
        True,
        Flag(
            "--no-replica-sync",
            "--processes replicas do not share their in-flight counts (each then sees the "
            "others' requests only in the workers' load reports) nor their rate limits (each "
            "then lets through a tenant's whole limit)",
            group=REPLICAS,
        ),
    )
    replica_sync_bind: str | None = option(
        None,
        Flag(
            "--replica-sync-bind",
            "ZeroMQ endpoint this replica publishes its in-flight counts and rate-limit "
            "spending on, e.g. tcp://10.0.0.5:30100; bind an address only the replicas reach "
            "(the messages are not authenticated; a forged one can skew load between "
            "configured workers or drain a tenant's limits, never add a worker)",
            metavar="ENDPOINT",
            group=REPLICAS,
        ),
    )
    replica_sync_peers: tuple[str, ...] = option(
        (),
        Flag(
            "--replica-sync-peers",
            "the other replicas' --replica-sync-bind endpoints; this replica's own may be in the "
            "list, so every replica can be given the same one",
            metavar="ENDPOINT",
            group=REPLICAS,
        ),
    )
    worker_urls: tuple[str, ...] = option(
        (),
        Flag(
            "--worker-urls",
            "SGLang worker base URLs (more can be added at runtime with POST /workers)",
            metavar="URL",
        ),
    )
    policy: str = option(
        "smetric",
        Flag(
            "--policy",
            "routing policy. smetric (default): the paper's Figure 13 (first turn balanced, "
            "follow-ups sticky to the worker holding their KV cache, with overload and eviction "
            "guards) with its guards and first-turn placement priced by delay, unprefilled "
            "tokens queued on a worker + (prompt - local hit) x (load + 1), and a follow-up whose "
            "history the global tier holds (--l3-view) sent where that delay is least (reason "
            "l3-move when it leaves its holder); plus the L3 view and session hints; "
            "smetric-l3move: the same policy under the name its first results use; "
            "smetric-inflight: the default before it, costs in requests in flight: first turns to "
            "the fewest, a follow-up leaves its holder when staying costs more than "
            "--move-cost-ratio x the cheapest move, cost (prompt - local hit) x (load + 1); "
            "smetric-ftwork: smetric-inflight with first turns sent to the "
            "worker with the fewest unprefilled tokens, not the fewest requests; smetric-ftrecent: "
            "smetric-inflight with first turns sent to the worker given the fewest new prompt "
            "tokens lately (halving every 5 minutes); smetric-ftcost: smetric-inflight with first "
            "turns sent where (prompt - local hit) x (load + 1) is least, as lmetric-inflight "
            "scores them (a shared prefix's holder while its queue costs less than the prefix); "
            "smetric-ftband: smetric-ftcost's cost among the workers within --move-cost-ratio "
            "x the least load only, so first turns stay balanced within that factor; "
            "smetric-delay: smetric-inflight with the worker's unprefilled tokens added to its "
            "cost (the prefill queued ahead of the request), first turns placed by that cost too "
            "(smetric without the l3-move); smetric-fetch: smetric-inflight with the global "
            "tier's hit (--l3-view) counted as fetched, not recomputed, in its move costs; "
            "smetric-paper: Figure 13 exactly; lmetric: the "
            "paper's baseline (new prefill tokens x reported running batch); lmetric-inflight: "
            "ours (x the router's in-flight count + 1); bailian: Bailian's scheduler (load and "
            "cache miss, --bailian-lambda); load_balance: least load; least_tokens: least KV "
            "tokens in use (the PD decode default); cache_aware, round_robin, random, "
            "power_of_two: as sglang-router",
            choices=policy_names,
        ),
    )
    policy_params: PolicyParams = field(default_factory=PolicyParams, metadata=nested())
    follow_up_priority: int = option(
        0,
        Flag(
            "--follow-up-priority",
            "send a follow-up (turn > 0, or a continued response) to its worker with SGLang's "
            "`priority` set to this, "
            "so that workers started with --enable-priority-scheduling take running sessions' "
            "turns before new sessions' in their queues; a client's own `priority` is kept, "
            "first turns and /v1/messages are sent as they came; 0 = off (bodies untouched). "
            "Give the workers --default-priority-value 0 too and keep this within SGLang's "
            "--priority-scheduling-preemption-threshold (10): SGLang ranks a request without a "
            "priority below every other and preempts running requests for one more than the "
            "threshold above them (docs/admission.md)",
            default_text="0 (off)",
        ),
    )
    prometheus_port: int | None = option(
        None,
        Flag(
            "--prometheus-port",
            "also serve /metrics on this port (it is always on the main port too)",
            default_text="off",
        ),
    )
    prometheus_host: str = option(
        "127.0.0.1", Flag("--prometheus-host", "address of --prometheus-port")
    )
    log_level: str = option(
        "info",
        Flag(
            "--log-level",
            "log level; debug logs one line per routing decision",
            choices=LOG_LEVELS,
        ),
    )
    request_timeout_secs: float = option(
        1800.0,
        Flag("--request-timeout-secs", "limit on one forwarded request, streaming included"),
    )
    tokenizer_path: str | None = option(
        None,
        Flag(
            "--tokenizer-path",
            "the workers' model directory, or one with its HF tokenizer.json "
            "(+ tokenizer_config.json): chats are rendered with its chat template "
            "(chat_template.jinja or tokenizer_config.json) and tokenized with its tokenizer, as "
            "SGLang does",
            metavar="PATH",
            default_text="the tokenizer and ChatML template shipped with smetric-router",
        ),
    )
    chat_template: str | None = option(
        None,
        Flag(
            "--chat-template",
            "a Jinja chat template (.jinja) to render chats with instead of the model's, for "
            "workers started with SGLang's --chat-template PATH",
            metavar="PATH",
            default_text="the model's",
        ),
    )
    page_size: int | None = option(
        None,
        Flag(
            "--page-size",
            "KV page size for page hashes; workers must agree",
            default_text="each worker's /server_info kv_events.block_size (else page_size)",
        ),
    )
    # Other replicas' requests reach a replica's view only through these reports: at 1 s, four
    # replicas placed up to a second of each other's arrivals blind (benchmarks/results/README.md).
    # /v1/loads reads a shared-memory snapshot in SGLang, no scheduler round-trip.
    load_poll_interval_secs: float = option(
        0.2,
        Flag(
            "--load-poll-interval-secs",
            "how often each worker's GET /v1/loads is read; policies see the router's own "
            "requests in flight, its synced replicas' (--processes, --replica-sync-peers) and "
            "what the report counts beyond both (running + waiting requests: other routers, "
            "direct clients); lmetric reads the reported running requests alone (the last "
            "report's, up to one interval old)",
        ),
    )
    health_check_interval_secs: float = option(
        5.0,
        Flag(
            "--health-check-interval-secs",
            "how often each worker's GET /health is checked; failing workers are excluded "
            "until they pass again",
        ),
    )
    health_check_timeout_secs: float = option(
        5.0,
        Flag("--health-check-timeout-secs", "timeout of one health check or info request"),
    )
    health_failure_threshold: int = option(
        3,
        Flag(
            "--health-failure-threshold",
            "consecutive failed health checks (error, non-200 or timeout) before a worker is "
            "excluded: SGLang's /health is a one-token generate behind the queue, so a busy "
            "worker can miss one. A request the worker refuses or drops excludes it at once",
        ),
    )
    health_success_threshold: int = option(
        2,
        Flag(
            "--health-success-threshold",
            "consecutive passed health checks before an excluded worker is taken back (one "
            "for a worker that never answered yet)",
        ),
    )
    max_body_bytes: int = option(
        32 * 1024 * 1024,
        Flag("--max-body-bytes", "largest request body accepted (larger ones get HTTP 413)"),
    )
    max_retries: int = option(
        2,
        Flag(
            "--max-retries",
            "how many other workers to try when a worker refuses the connection or answers "
            "5xx before its first byte",
        ),
    )
    kv_events: bool = option(
        True,
        Flag(
            "--no-kv-events",
            "do not subscribe to the workers' KV events (cache hits then stay unknown)",
        ),
    )
    # KV-event feed hardening: follow a KV-event host a worker's /server_info names
    # even when it is not the worker's own host (off: such a feed is refused).
    trust_kv_endpoints: bool = option(
        False,
        Flag(
            "--trust-kv-endpoints",
            "subscribe to the KV-event host a worker's /server_info names even when it is not "
            "the worker's own host; by default such a worker's events are refused (logged, its "
            "cache view stays empty), so a worker cannot point the router at another machine. "
            "A wildcard host (*, 0.0.0.0, ::) always means the worker's own host",
        ),
    )
    # Count a dispatched request's pages as held by its worker until it ends (plus a grace for
    # its KV events): a follow-up sent while its prefix is still in flight finds its holder.
    inflight_prefixes: bool = option(
        True,
        Flag(
            "--no-inflight-prefixes",
            "count only what the workers' KV events (or probes) show as cached; by default a "
            "request's prompt pages also count as held by the worker it was sent to while it is "
            f"in flight and for {GRACE_S:g} s after (cluster/inflight.py), so that a follow-up "
            "or fork sent before those events arrive (e.g. bench_serving's concurrent Mooncake "
            "rounds) finds its holder",
        ),
    )
    # Where per-worker cache hits come from: "events" (KV-event index) or "probe" (ask each worker's
    # patched SGLang /smetric/prefix_match per request, see patches/).
    cache_view: str = option(
        "events",
        Flag(
            "--cache-view",
            "where per-worker cache hits come from: 'events' (KV-event index) or 'probe' (ask "
            "each healthy worker's POST /smetric/prefix_match per request; needs the patched "
            "SGLang of patches/ or the emulator; no KV-event subscription)",
            choices=CACHE_VIEWS,
        ),
    )
    probe_timeout_secs: float = option(
        0.05,
        Flag(
            "--probe-timeout-secs",
            "probe mode: a worker that has not answered the probe by then counts as hit 0",
        ),
    )
    l3_view: str = option(
        "off",
        Flag(
            "--l3-view",
            "where L3 hits come from: 'master' asks the Mooncake master's HTTP API "
            "(/batch_query_keys on SGLang's page keys, cached, within --l3-budget-secs; works "
            "with stock SGLang), 'events' reads L3 KV events from workers running the fork's "
            "patch (patches/), 'off' = no L3 figure (the guard as the paper writes it)",
            choices=L3_VIEWS,
            group=L3,
        ),
    )
    mooncake_master_url: str | None = option(
        None,
        Flag(
            "--mooncake-master-url",
            "http://HOST:PORT of mooncake_master's HTTP port (its --metrics_port), for "
            "--l3-view master",
            metavar="URL",
            group=L3,
        ),
    )
    l3_key_prefix: str | None = option(
        None,
        Flag(
            "--l3-key-prefix",
            "prefix of SGLang's Mooncake keys",
            metavar="PREFIX",
            group=L3,
            default_text="the served model name with '/' -> '-' (what SGLang's MooncakeStore "
            "uses without --hicache-storage-backend-extra-config extra_backend_tag)",
        ),
    )
    l3_tp_rank: int = option(
        0,
        Flag(
            "--l3-tp-rank",
            "TP rank whose keys are asked for (each rank writes its own)",
            metavar="RANK",
            group=L3,
        ),
    )
    l3_budget_secs: float = option(
        0.025,
        Flag(
            "--l3-budget-secs",
            "longest a lookup waits for the master (asked beside every request, waited for "
            "before the decision only where the policy's decision turns on it); a slower "
            "answer counts as 'unknown' (never as a miss)",
            group=L3,
        ),
    )
    l3_cache_ttl_secs: float = option(
        30.0,
        Flag(
            "--l3-cache-ttl-secs",
            "how long a page seen in L3 is trusted without asking the master again",
            group=L3,
        ),
    )
    # PD disaggregation: prefill (URL, bootstrap port or None = discover) and decode instances.
    pd_disaggregation: bool = option(
        False,
        Flag(
            "--pd-disaggregation",
            "route each request to a (prefill, decode) pair with SGLang's bootstrap fields",
            group=PD,
        ),
    )
    prefill: tuple[tuple[str, int | None], ...] = option(
        (),
        Flag(
            "--prefill",
            "a prefill instance (repeatable); BOOTSTRAP_PORT or 'none' (the default) = read "
            "disaggregation_bootstrap_port from its /server_info",
            metavar=("URL", "BOOTSTRAP_PORT"),
            group=PD,
            nargs="+",
            repeat=True,
            convert=prefill_specs,
        ),
    )
    decode_urls: tuple[str, ...] = option(
        (),
        Flag("--decode", "a decode instance (repeatable)", metavar="URL", group=PD, repeat=True),
    )
    prefill_policy: str | None = option(
        None,
        Flag(
            "--prefill-policy",
            "policy over prefill instances, whose load is unprefilled tokens",
            choices=policy_names,
            group=PD,
            default_text="--policy",
        ),
    )
    decode_policy: str = option(
        "least_tokens",
        Flag(
            "--decode-policy",
            "policy over decode instances, whose load is tokens in use",
            choices=policy_names,
            group=PD,
            unset=True,  # given without --pd-disaggregation is an error
        ),
    )
    # Dispatch until the prefill is done (its reply ended, or decode's first byte) at most this.
    pd_handover_timeout_secs: float = option(
        300.0,
        Flag(
            "--pd-handover-timeout-secs",
            "limit on the wait for a prefill to finish (its reply, or the decode's first byte); "
            "past it the client gets 504",
            group=PD,
        ),
    )
    shutdown_grace_secs: float = option(
        30.0,
        Flag(
            "--shutdown-grace-secs",
            "on SIGTERM/SIGINT: /readiness answers 503 at once (a balancer drains the replica), "
            "new requests get 503, open ones get this many seconds to finish; then a stream "
            "still open is ended with an SSE error event (code router_shutting_down) and a "
            "request still waiting for its worker gets 503, and the router exits 0. A second "
            "signal ends the grace at once. Each --processes replica drains the same way",
            group=LIFECYCLE,
        ),
    )
    # Connections to workers open at once (each a file descriptor); 0 = half the open-file limit.
    # Past it, requests wait for a free one.
    max_upstream_connections: int = option(
        0,
        Flag(
            "--max-upstream-connections",
            "connections to workers open at once, over all workers (each is a file "
            "descriptor, as is each client connection); a request finding all in use waits for "
            "one (within its own timeouts) instead of failing. 0 = half the open-file limit, "
            "which the router raises to its hard limit at start",
            metavar="N",
            group=UPSTREAM,
        ),
    )
    # Retry a request whose worker dropped the connection after it was sent (it may have run).
    retry_on_reset: bool = option(
        False,
        Flag(
            "--retry-on-reset",
            "also retry on another worker a request whose worker dropped the connection "
            "after the request was sent, before answering. Off by default: the worker may have "
            "run it, and a request that crashes a worker would crash the next ones too",
            group=UPSTREAM,
        ),
    )
    # Admission (smetric_router/admission/): names as smg's where smg has the flag.
    max_concurrent_requests: int = option(
        0,
        Flag(
            "--max-concurrent-requests",
            "requests the router has in flight at once, over all workers; more wait in the "
            "router queue. 0 = no cap",
            metavar="N",
            group=ADMISSION,
        ),
    )
    queue_size: int = option(
        100,
        Flag(
            "--queue-size",
            "requests that may wait for room at once; past it a request is answered 429 "
            "(a running session's follow-up instead takes the place of the newest new-session "
            "request, which gets the 429)",
            metavar="N",
            group=ADMISSION,
        ),
    )
    queue_timeout_secs: float = option(
        60.0,
        Flag(
            "--queue-timeout-secs",
            "longest wait in the router queue; past it the request is answered 429, its "
            "Retry-After the time its tenant's queue needs at the pace it has been admitted "
            "(docs/admission.md#errors)",
            group=ADMISSION,
        ),
    )
    rate_limit_tokens_per_second: float = option(
        0.0,
        Flag(
            "--rate-limit-tokens-per-second",
            "prompt tokens per second the router takes in, over all clients (smg's flag of "
            "this name counts requests; this one counts the prompt tokens the router "
            "tokenized); past it a request is answered 429 with Retry-After. A bucket of one "
            "second's worth, refilled continuously; a prompt larger than that passes on a "
            "full bucket and leaves it in debt. Per router process. 0 = no limit",
            metavar="N",
            group=ADMISSION,
        ),
    )
    max_queued_requests_per_worker: int = option(
        0,
        Flag(
            "--max-queued-requests-per-worker",
            "a worker reporting this many requests waiting (its /v1/loads num_waiting_reqs, "
            "plus what the router sent it since) takes no more until it drains: its "
            "follow-ups wait, new sessions go to a worker with room. 0 = not checked",
            metavar="N",
            group=ADMISSION,
        ),
    )
    queue_first_turn_ceiling_secs: float = option(
        5.0,
        Flag(
            "--queue-first-turn-ceiling-secs",
            "a new session's first request that has waited this long goes before follow-ups "
            "(which otherwise go first), so a stream of follow-ups cannot starve new sessions",
            group=ADMISSION,
        ),
    )
    queue_session_grace_secs: float = option(
        0.0,
        Flag(
            "--queue-session-grace-secs",
            "with --max-concurrent-requests: the slot a request frees when it ends is kept this "
            "long for the request that continues its conversation (a follow-up whose prompt "
            "holds the ended prompt), which takes it without queueing: running sessions keep "
            "their slots and new ones wait for a slot nobody claims. 0 = not kept",
            group=ADMISSION,
        ),
    )
    # Circuit breaking (smetric_router/breaker/): names as smg's where smg has the flag.
    disable_circuit_breaker: bool = option(
        False,
        Flag(
            "--disable-circuit-breaker",
            "never open a worker's circuit: only the health check excludes workers",
            group=BREAKER,
        ),
    )
    cb_failure_threshold: int = option(
        10,
        Flag(
            "--cb-failure-threshold",
            "failures in a row that open a worker's circuit",
            metavar="N",
            group=BREAKER,
        ),
    )
    cb_success_threshold: int = option(
        3,
        Flag(
            "--cb-success-threshold",
            "probe successes in a row that close a half-open circuit (a probe failure opens it "
            "again)",
            metavar="N",
            group=BREAKER,
        ),
    )
    cb_timeout_duration_secs: float = option(
        60.0,
        Flag(
            "--cb-timeout-duration-secs",
            "cool-down of an open circuit: no requests go to the worker for this long, then it "
            "turns half-open",
            group=BREAKER,
        ),
    )
    cb_window_duration_secs: float = option(
        120.0,
        Flag(
            "--cb-window-duration-secs",
            "the window --cb-failure-ratio is measured over",
            group=BREAKER,
        ),
    )
    # Off by default, as smg has no ratio rule: SGLang answers some malformed requests with a
    # 500, so a share of failures can come from clients, while a run of them in a row does not.
    cb_failure_ratio: float = option(
        0.0,
        Flag(
            "--cb-failure-ratio",
            "also open a circuit once failures reach this share of a worker's outcomes within "
            "--cb-window-duration-secs (from --cb-min-requests outcomes on). 0 = off",
            group=BREAKER,
        ),
    )
    cb_min_requests: int = option(
        20,
        Flag(
            "--cb-min-requests",
            "outcomes within the window before --cb-failure-ratio applies",
            metavar="N",
            group=BREAKER,
        ),
    )
    cb_half_open_max_requests: int = option(
        1,
        Flag(
            "--cb-half-open-max-requests",
            "probes in flight at once on a half-open worker; other requests go elsewhere",
            metavar="N",
            group=BREAKER,
        ),
    )
    # Dispatch to the worker's first body byte (queue + prefill; a non-streamed request past it
    # only once its worker also fails health checks), and longest silence between body bytes of
    # a stream; past either the worker is marked failed and the request ends.
    first_byte_timeout_secs: float = option(
        600.0,
        Flag(
            "--first-byte-timeout-secs",
            "longest wait from dispatch to the worker's first response byte, queueing and "
            "prefill included; past it the worker is marked failed and the request answered 504 "
            "(or ended with an SSE error event). Generous by default: a 100K-token agent prompt "
            "prefills in seconds on an idle GPU but queues behind other long prefills on a busy "
            "one. A non-streamed reply's first byte is its whole answer: past this bound it is "
            "awaited while its worker passes its health checks (a hung SGLang fails them), up "
            "to --request-timeout-secs",
            group=UPSTREAM,
        ),
    )
    stream_idle_timeout_secs: float = option(
        300.0,
        Flag(
            "--stream-idle-timeout-secs",
            "streams: longest silence between two chunks once the first came; past it the "
            "worker is marked failed and the stream ended with an SSE error event. Generous by "
            "default: SGLang may retract a running request under KV-cache pressure and prefill "
            "it again, and tool-call parsers hold text back",
            group=UPSTREAM,
        ),
    )
    # Authentication (router/auth.py). Keys stay out of repr(): a logged config shows no secret.
    api_key: str | None = option(
        None,
        Flag(
            "--api-key",
            "key the inference endpoints need (generation, /v1/models, GET /workers, "
            "/smetric/prefix_match); a request without it gets 401",
            metavar="KEY",
            group=AUTH,
            env=API_KEY_ENV,
            default_text=f"${API_KEY_ENV} (the environment is not visible to other users as a "
            "command line is), else none: open",
        ),
        repr=False,
    )
    admin_api_key: str | None = option(
        None,
        Flag(
            "--admin-api-key",
            "key of the admin endpoints (POST/DELETE /workers, POST /flush_cache): 401 without "
            "a key, 403 with another; without one, admin endpoints take the --api-key, and with "
            "no key at all only loopback clients (behind a reverse proxy on this host every "
            "client is loopback: set a key there)",
            metavar="KEY",
            group=AUTH,
            env=ADMIN_API_KEY_ENV,
            default_text=f"${ADMIN_API_KEY_ENV}, else none",
        ),
        repr=False,
    )
    api_key_file: str | None = option(
        None,
        Flag(
            "--api-key-file",
            "tenants: a YAML or JSON file {tenants: [...]}, each entry a name and a key (or "
            "key_env, an environment variable holding it) with optional requests_per_minute, "
            "tokens_per_minute (prompt tokens as the router counts them, max_tokens not "
            "included), weight in the admission queue (default 1) and max_priority (the "
            "highest `priority` its requests may ask; more is a 400). Inference endpoints then "
            "need one of its keys (401 otherwise); a tenant over a limit gets 429 with "
            "Retry-After. Given with --api-key, that key is one more tenant, 'default', without "
            "limits. Each router process keeps its own buckets "
            "(docs/admission.md#tenants-and-priorities)",
            metavar="PATH",
            group=AUTH,
        ),
    )
    worker_api_key: str | None = option(
        None,
        Flag(
            "--worker-api-key",
            "the workers' key (SGLang's --api-key): sent as 'Authorization: Bearer KEY' on "
            "forwarded requests and on the router's own calls (health, server_info, loads, "
            "flush); excludes --forward-authorization",
            metavar="KEY",
            group=AUTH,
            env=WORKER_API_KEY_ENV,
            default_text=f"${WORKER_API_KEY_ENV}, else none",
        ),
        repr=False,
    )
    forward_authorization: bool = option(
        False,
        Flag(
            "--forward-authorization",
            "pass the client's own Authorization header on to the worker (by default it is "
            "dropped: it holds the router's key, not the worker's)",
            group=AUTH,
        ),
    )
    # OpenAI Responses (router/api_responses.py): the key that signs the response ids the
    # router hands out (they name their holder); None: a random one per router, ids die with it.
    response_id_key: str | None = option(
        None,
        Flag(
            "--response-id-key",
            "secret (16+ characters) that signs the response ids; routers that must accept "
            "each other's ids (replicas behind one address, a restarted router) need the same "
            "one",
            metavar="KEY",
            group=RESPONSES,
            env=RESPONSE_ID_KEY_ENV,
            default_text=f"${RESPONSE_ID_KEY_ENV}, else a random key per router (its "
            "--processes replicas share it): ids then die with the router process",
        ),
        repr=False,
    )
    # Request limits: the served context length (None: the smallest the workers report).
    context_length: int | None = option(
        None,
        Flag(
            "--context-length",
            "the served context length: prompts of this many tokens or more, and a max_tokens "
            "(max_completion_tokens, max_new_tokens) that with the prompt exceeds it, are "
            "refused with 400 as SGLang refuses them; a huge prompt as soon as a prefix shows "
            "it too long",
            metavar="TOKENS",
            group=LIMITS,
            default_text="the smallest max_model_len the workers' /v1/models report (unknown: "
            "no limit)",
        ),
    )
    # Coding agents: read the session id an agent sends (x-claude-code-session-id,
    # session_id, x-session-affinity, prompt_cache_key...) as a hint the policy may use
    # (features/session_hint.py, policies/session_home.py).
    session_hints: bool = option(
        True,
        Flag(
            "--no-session-hints",
            "ignore the session ids coding agents send (x-claude-code-session-id, session_id, "
            "x-session-affinity, x-opencode-session, Anthropic metadata.user_id, OpenAI "
            "prompt_cache_key). By default smetric reads one as a tie-breaker only: among "
            "equally good workers (the least loaded for a first request, equal holders, or the "
            "cheapest for a follow-up its guards move, decision reason session-hint-fallback) "
            "the session's home worker (rendezvous hash of the id) wins. Turn inference never "
            "needs a hint",
            group=AGENTS,
        ),
    )
    # Anthropic `thinking` for workers without a reasoning parser (ANTHROPIC_THINKING above).
    anthropic_thinking: str = option(
        "drop",
        Flag(
            "--anthropic-thinking",
            "what to do with an Anthropic Messages `thinking` (Claude Code sends one on every "
            "request) when no worker of the model reports a reasoning parser in /server_info: "
            "SGLang refuses it there with a 400. drop: forward the request without it and "
            "without context_management's clear_thinking edits, which is how such a worker "
            "serves a request that has none (counted in "
            "smetric_anthropic_dropped_total{field}); reject: forward it as it came, for the "
            "workers' own 400",
            choices=ANTHROPIC_THINKING,
            group=AGENTS,
        ),
    )

    # Worker discovery (discovery/): Kubernetes pods or a file, flag names as sglang_router's.
    service_discovery: bool = option(
        False,
        Flag(
            "--service-discovery",
            "discover workers from Kubernetes pods (the same as --discovery-provider "
            "kubernetes): a pod matching --selector becomes a worker at http://POD_IP:PORT once "
            "it is Running and Ready, and leaves when deleted, not ready or moved to another IP",
            group=DISCOVERY,
        ),
    )
    discovery_provider: str | None = option(
        None,
        Flag(
            "--discovery-provider",
            "where discovered workers come from: kubernetes (pods, as --service-discovery) or "
            "file (--discovery-file)",
            choices=DISCOVERY_PROVIDERS,
            group=DISCOVERY,
            default_text="none",
        ),
    )
    selector: tuple[str, ...] = option(
        (),
        Flag(
            "--selector",
            "labels a worker pod carries, as key=value items (all must match; a comma also "
            "separates items); only equality, no set-based or != expressions",
            metavar="KEY=VALUE",
            group=DISCOVERY,
        ),
    )
    prefill_selector: tuple[str, ...] = option(
        (),
        Flag(
            "--prefill-selector",
            "under --pd-disaggregation: labels of prefill pods (key=value, all must match); "
            "a prefill's bootstrap port is its --bootstrap-port-annotation, else its "
            "/server_info's disaggregation_bootstrap_port",
            metavar="KEY=VALUE",
            group=DISCOVERY,
        ),
    )
    decode_selector: tuple[str, ...] = option(
        (),
        Flag(
            "--decode-selector",
            "under --pd-disaggregation: labels of decode pods (key=value, all must match)",
            metavar="KEY=VALUE",
            group=DISCOVERY,
        ),
    )
    service_discovery_port: int = option(
        8000,
        Flag(
            "--service-discovery-port",
            "port of SGLang's HTTP server in every worker pod",
            group=DISCOVERY,
        ),
    )
    service_discovery_namespace: str | None = option(
        None,
        Flag(
            "--service-discovery-namespace",
            "namespace whose pods are watched (a Role suffices)",
            metavar="NAMESPACE",
            group=DISCOVERY,
            default_text="all namespaces (needs a ClusterRole)",
        ),
    )
    bootstrap_port_annotation: str = option(
        BOOTSTRAP_ANNOTATION,
        Flag(
            "--bootstrap-port-annotation",
            "pod annotation holding a prefill pod's bootstrap port",
            metavar="NAME",
            group=DISCOVERY,
        ),
    )
    discovery_file: str | None = option(
        None,
        Flag(
            "--discovery-file",
            "with --discovery-provider file: a JSON or YAML list of workers, each a URL or "
            '{"url", "role" (prefill/decode, under PD), "bootstrap_port"}; read again when its '
            "content changes; a file that does not parse changes nothing",
            metavar="PATH",
            group=DISCOVERY,
        ),
    )
    discovery_file_interval_secs: float = option(
        1.0,
        Flag(
            "--discovery-file-interval-secs",
            "how often --discovery-file is read; a change is taken once two reads agree on it",
            group=DISCOVERY,
        ),
    )

    # Tracing (router/otel_trace.py), flag names and defaults as SGLang's own.
    enable_trace: bool = option(
        False,
        Flag(
            "--enable-trace",
            "send a trace of each request (its decision, worker attempts, PD legs) to the OTLP "
            "collector at --otlp-traces-endpoint; the workers get the trace context (traceparent)",
            group=TRACING,
        ),
    )
    otlp_traces_endpoint: str = option(
        "localhost:4317",
        Flag(
            "--otlp-traces-endpoint",
            "the OTLP collector: host:port for grpc, the full URL (http://host:port/v1/traces) "
            "for http/protobuf",
            metavar="ENDPOINT",
            group=TRACING,
        ),
    )
    otlp_service_name: str | None = option(
        None,
        Flag(
            "--otlp-service-name",
            "the traces' service.name",
            metavar="NAME",
            group=TRACING,
            default_text="$OTEL_SERVICE_NAME, else smetric-router",
        ),
    )

    def __post_init__(self) -> None:
        if self.page_size is not None and self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.processes < 1:
            raise ValueError(f"processes must be >= 1, got {self.processes}")
        if self.replica_sync_peers and self.replica_sync_bind is None:
            raise ValueError("--replica-sync-peers needs --replica-sync-bind")
        if self.replica_sync_bind is not None and not self.replica_sync:
            raise ValueError("--replica-sync-bind and --no-replica-sync contradict each other")
        if self.follow_up_priority not in PRIORITY_RANGE:
            raise ValueError("follow_up_priority must be a signed 64-bit integer (SGLang's)")
        if self.max_upstream_connections < 0:
            raise ValueError(
                f"max_upstream_connections must be >= 0, got {self.max_upstream_connections}"
            )
        for name in (
            "max_concurrent_requests",
            "queue_size",
            "max_queued_requests_per_worker",
            "rate_limit_tokens_per_second",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.queue_timeout_secs <= 0 or self.queue_first_turn_ceiling_secs < 0:
            raise ValueError("queue_timeout_secs must be > 0, queue_first_turn_ceiling_secs >= 0")
        if not self.queue_session_grace_secs >= 0:
            raise ValueError(
                f"queue_session_grace_secs must be >= 0, got {self.queue_session_grace_secs}"
            )
        if self.queue_session_grace_secs and not self.max_concurrent_requests:
            raise ValueError("--queue-session-grace-secs keeps slots of --max-concurrent-requests")
        self.breaker()  # so that a bad circuit flag stops the start, not the first request
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        for name in ("health_failure_threshold", "health_success_threshold"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
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
        if self.pd_disaggregation:
            if self.worker_urls:
                raise ValueError(
                    "--worker-urls cannot be mixed with --pd-disaggregation: give the workers "
                    "as --prefill URL [BOOTSTRAP_PORT] and --decode URL"
                )
            if not (self.prefill and self.decode_urls) and self.discovery_kind is None:
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
        self.tenants()  # a bad key file stops the start, naming the field
        if self.worker_api_key is not None and self.forward_authorization:
            raise ValueError(
                "--worker-api-key and --forward-authorization exclude each other: the workers get "
                "either the router's worker key or the client's own Authorization header"
            )
        if self.response_id_key is not None and len(self.response_id_key) < 16:
            raise ValueError("response_id_key must be at least 16 characters (it signs ids)")
        if self.enable_trace and not self.otlp_traces_endpoint.strip():
            raise ValueError("--enable-trace needs --otlp-traces-endpoint")
        self.worker_specs()  # URL and port checks fail here, at start-up
        self.discovery_settings()  # selector and provider checks too

    @property
    def discovery_kind(self) -> str | None:
        if self.service_discovery and self.discovery_provider == "file":
            raise ValueError(
                "--service-discovery is --discovery-provider kubernetes: it cannot be combined "
                "with --discovery-provider file"
            )
        return "kubernetes" if self.service_discovery else self.discovery_provider

    def discovery_settings(self) -> DiscoverySettings | None:
        """What discovery/ runs with; None without discovery. Raises ValueError on flags that
        do not fit together, with a one-line message naming them."""
        from smetric_router.discovery.file import FileSettings
        from smetric_router.discovery.kubernetes import KubeSettings
        from smetric_router.discovery.pods import PodRules

        kind = self.discovery_kind
        kube_flags = [
            name
            for name, given in (
                ("--selector", self.selector),
                ("--prefill-selector", self.prefill_selector),
                ("--decode-selector", self.decode_selector),
                ("--service-discovery-namespace", self.service_discovery_namespace),
            )
            if given
        ]
        if kind != "kubernetes" and kube_flags:
            raise ValueError(f"{', '.join(kube_flags)} need --service-discovery")
        if kind != "file" and self.discovery_file is not None:
            raise ValueError("--discovery-file needs --discovery-provider file")
        if self.discovery_file_interval_secs <= 0:
            raise ValueError("discovery_file_interval_secs must be > 0")
        if kind == "file":
            if not self.discovery_file:
                raise ValueError("--discovery-provider file needs --discovery-file PATH")
            return FileSettings(
                Path(self.discovery_file), self.pd_disaggregation, self.discovery_file_interval_secs
            )
        if kind is None:
            return None
        try:
            selector = parse_selector(self.selector)
            prefill = parse_selector(self.prefill_selector, "--prefill-selector")
            decode = parse_selector(self.decode_selector, "--decode-selector")
        except SelectorError as e:
            raise ValueError(str(e)) from None
        if not 0 < self.service_discovery_port < 65536:
            raise ValueError("--service-discovery-port must be in 1..65535")
        ns = self.service_discovery_namespace
        if ns is not None and not _NAMESPACE_RE.fullmatch(ns):
            raise ValueError(f"--service-discovery-namespace {ns!r} is not a namespace name")
        if not self.bootstrap_port_annotation.strip():
            raise ValueError("--bootstrap-port-annotation must not be empty")
        roles: tuple[LabelSelector | None, LabelSelector | None] = (None, None)
        if self.pd_disaggregation:
            if not (prefill or decode):
                raise ValueError(
                    "--service-discovery with --pd-disaggregation needs --prefill-selector "
                    "and/or --decode-selector: a pod's role comes from its labels"
                )
            roles = (prefill or None, decode or None)
        else:
            if prefill or decode:
                raise ValueError(
                    "--prefill-selector and --decode-selector need --pd-disaggregation"
                )
            if not selector:
                raise ValueError(
                    "--service-discovery needs --selector key=value: every pod in sight would "
                    "otherwise become a worker"
                )
        rules = PodRules(
            port=self.service_discovery_port,
            selector=selector,
            prefill=roles[0],
            decode=roles[1],
            bootstrap_annotation=self.bootstrap_port_annotation,
        )
        return KubeSettings(rules, namespace=ns)

    @property
    def prefill_policy_name(self) -> str:
        return self.prefill_policy or self.policy

    def admission(self) -> AdmissionConfig | None:
        """The admission settings; None when admission is off (neither bound set)."""
        if not self.max_concurrent_requests and not self.max_queued_requests_per_worker:
            return None
        return AdmissionConfig(
            max_concurrent=self.max_concurrent_requests or None,
            queue_size=self.queue_size,
            timeout_s=self.queue_timeout_secs,
            ceiling_s=self.queue_first_turn_ceiling_secs,
            max_queued_per_worker=self.max_queued_requests_per_worker,
            session_grace_s=self.queue_session_grace_secs,
        )

    def breaker(self) -> BreakerConfig | None:
        """The circuit settings; None with --disable-circuit-breaker."""
        if self.disable_circuit_breaker:
            return None
        return BreakerConfig(
            failure_threshold=self.cb_failure_threshold,
            success_threshold=self.cb_success_threshold,
            open_s=self.cb_timeout_duration_secs,
            window_s=self.cb_window_duration_secs,
            failure_ratio=self.cb_failure_ratio,
            min_requests=self.cb_min_requests,
            half_open_max=self.cb_half_open_max_requests,
        )

    def worker_specs(self) -> list[WorkerSpec]:
        return (
            [WorkerSpec(u) for u in self.worker_urls]
            + [WorkerSpec(u, Role.PREFILL, port) for u, port in self.prefill]
            + [WorkerSpec(u, Role.DECODE) for u in self.decode_urls]
        )

    def tenants(self) -> TenantTable | None:
        """--api-key-file's tenants (read now, keys from the environment where the file says
        so); None without a key file. Raises ValueError (KeyFileError) naming the field."""
        if self.api_key_file is None:
            return None
        return load_tenants(self.api_key_file, self.api_key)

    def auth(self, tenants: TenantTable | None = None) -> AuthPolicy:
        """tenants: the table tenants() read (given, so the file is read once per router)."""
        return AuthPolicy(
            self.api_key,
            self.admin_api_key,
            self.worker_api_key,
            self.forward_authorization,
            tenants,
        )

    def worker_headers(self) -> dict[str, str]:
        """What the router's own calls to the workers (health, info, loads, flush) carry."""
        return bearer(self.worker_api_key) if self.worker_api_key is not None else {}
