"""`smetric-router` / `python -m smetric_router`: flags -> RouterConfig -> a running router.

Flag names follow `python -m sglang_router.launch_router` where the meaning is the same, so the
router is a drop-in replacement.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from aiohttp import web

from smetric_router.cluster.inflight import GRACE_S
from smetric_router.core.port_file import bound_port, write_port_file
from smetric_router.policies import PolicyParams, policy_names
from smetric_router.router.api_responses import RESPONSE_ID_KEY_ENV
from smetric_router.router.auth import describe
from smetric_router.router.config import ANTHROPIC_THINKING, CACHE_VIEWS, L3_VIEWS, RouterConfig
from smetric_router.router.limits import raise_open_files_limit

if TYPE_CHECKING:
    from smetric_router.router.app import RouterState

log = logging.getLogger("smetric_router.router")

_D = RouterConfig()
_P = PolicyParams()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="smetric-router",
        description="SMetric balanced session-centric router for SGLang workers (OpenAI and "
        "SGLang /generate APIs). Flags match sglang_router.launch_router where they mean the same.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--host", default=_D.host, help="address the router listens on")
    p.add_argument(
        "--port", type=int, default=_D.port, help="port of the router's HTTP API; 0 = any free port"
    )
    p.add_argument(
        "--port-file",
        default=None,
        metavar="PATH",
        help="once listening, write the bound ports here as JSON (http, and prometheus with "
        "--prometheus-port): how a launcher learns a port given as 0",
    )
    p.add_argument(
        "--processes",
        type=int,
        default=_D.processes,
        help="serve with N router processes on one port (SO_REUSEPORT, Linux): the kernel spreads "
        "connections over them; each is a full replica of this stateless router (its own worker "
        "view, KV-event subscriptions and /metrics; --prometheus-port stays with the first)",
    )
    p.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--worker-urls",
        nargs="*",
        default=[],
        metavar="URL",
        help="SGLang worker base URLs (more can be added at runtime with POST /workers)",
    )
    p.add_argument(
        "--policy",
        default=_D.policy,
        choices=policy_names(),
        help="routing policy; smetric = the paper's Figure 13 (first turn balanced, follow-ups "
        "sticky to the worker holding their KV cache, with overload and eviction guards)",
    )
    pd = p.add_argument_group(
        "PD disaggregation", "prefill and decode on separate SGLang instances (as sglang_router)"
    )
    pd.add_argument(
        "--pd-disaggregation",
        action="store_true",
        help="route each request to a (prefill, decode) pair with SGLang's bootstrap fields",
    )
    pd.add_argument(
        "--prefill",
        nargs="+",
        action="append",
        default=[],
        metavar=("URL", "BOOTSTRAP_PORT"),
        help="a prefill instance (repeatable); BOOTSTRAP_PORT or 'none' (the default) = read "
        "disaggregation_bootstrap_port from its /server_info",
    )
    pd.add_argument(
        "--decode",
        action="append",
        default=[],
        metavar="URL",
        help="a decode instance (repeatable)",
    )
    pd.add_argument(
        "--prefill-policy",
        default=argparse.SUPPRESS,  # absent: --policy
        choices=policy_names(),
        help="policy over prefill instances, whose load is unprefilled tokens (default: --policy)",
    )
    pd.add_argument(
        "--decode-policy",
        default=argparse.SUPPRESS,
        choices=policy_names(),
        help=f"policy over decode instances, whose load is tokens in use (default: "
        f"{_D.decode_policy})",
    )
    pd.add_argument(
        "--prefill-overload-slack",
        type=float,
        default=_D.prefill_overload_slack,
        help="smetric on prefill instances: --overload-slack in unprefilled tokens",
    )
    pd.add_argument(
        "--pd-handover-timeout-secs",
        type=float,
        default=_D.pd_handover_timeout_secs,
        help="limit on the wait for a prefill to finish (its reply, or the decode's first byte); "
        "past it the client gets 504",
    )
    p.add_argument(
        "--prometheus-port",
        type=int,
        default=None,
        help="also serve /metrics on this port (it is always on the main port too)",
    )
    p.add_argument(
        "--prometheus-host", default=_D.prometheus_host, help="address of --prometheus-port"
    )
    p.add_argument(
        "--log-level",
        default=_D.log_level,
        choices=["debug", "info", "warning", "error", "critical"],
        help="log level; debug logs one line per routing decision",
    )
    p.add_argument(
        "--request-timeout-secs",
        type=float,
        default=_D.request_timeout_secs,
        help="limit on one forwarded request, streaming included",
    )
    p.add_argument(
        "--overload",
        type=float,
        default=_P.overload,
        help="smetric: a follow-up is not sent to its cache holder when that worker's load "
        "exceeds OVERLOAD x the mean load (it is balanced instead)",
    )
    p.add_argument(
        "--overload-slack",
        type=float,
        default=_P.overload_slack,
        help="smetric: ...and by more than this much above the mean (in load units: requests), "
        "so that a couple of extra requests at light load are not an overload; 0 = the paper's "
        "ratio only",
    )
    p.add_argument(
        "--hit-ratio",
        type=float,
        default=_P.hit_ratio,
        help="smetric: a follow-up whose best cached prefix is at most HIT_RATIO x its history "
        "is treated as evicted and balanced",
    )
    p.add_argument(
        "--bailian-lambda",
        type=float,
        default=_P.bailian_lambda,
        help="bailian: weight of the cache-miss term against the load term",
    )
    p.add_argument(
        "--cache-threshold",
        type=float,
        default=_P.cache_threshold,
        help="cache_aware: minimum text-match ratio to follow the tree",
    )
    p.add_argument(
        "--balance-abs-threshold",
        type=float,
        default=_P.balance_abs_threshold,
        help="cache_aware: load gap (max-min) above which the cluster counts as imbalanced",
    )
    p.add_argument(
        "--balance-rel-threshold",
        type=float,
        default=_P.balance_rel_threshold,
        help="cache_aware: load ratio (max/min) above which the cluster counts as imbalanced",
    )
    p.add_argument(
        "--tokenizer-path",
        default=None,
        help="the workers' model directory, or one with its HF tokenizer.json "
        "(+ tokenizer_config.json): chats are rendered with its chat template (chat_template.jinja "
        "or tokenizer_config.json) and tokenized with its tokenizer, as SGLang does; default: the "
        "tokenizer and ChatML template shipped with smetric-router",
    )
    p.add_argument(
        "--chat-template",
        default=None,
        metavar="PATH",
        help="a Jinja chat template (.jinja) to render chats with instead of the model's, for "
        "workers started with SGLang's --chat-template PATH",
    )
    p.add_argument(
        "--page-size",
        type=int,
        default=None,
        help="KV page size for page hashes; default: each worker's /server_info "
        "kv_events.block_size (else page_size); workers must agree",
    )
    p.add_argument(
        "--load-poll-interval-secs",
        type=float,
        default=_D.load_poll_interval_secs,
        help="how often each worker's GET /v1/loads is read; policies see "
        "max(router in-flight, reported running + waiting requests); lmetric reads the "
        "reported running requests alone",
    )
    p.add_argument(
        "--health-check-interval-secs",
        type=float,
        default=_D.health_check_interval_secs,
        help="how often each worker's GET /health is checked; failing workers are excluded "
        "until they pass again",
    )
    p.add_argument(
        "--health-check-timeout-secs",
        type=float,
        default=_D.health_check_timeout_secs,
        help="timeout of one health check or info request",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=_D.max_body_bytes,
        help="largest request body accepted (larger ones get HTTP 413)",
    )
    p.add_argument(
        "--max-retries",
        type=int,
        default=_D.max_retries,
        help="how many other workers to try when a worker refuses the connection or answers "
        "5xx before its first byte",
    )
    p.add_argument(
        "--no-kv-events",
        action="store_true",
        help="do not subscribe to the workers' KV events (cache hits then stay unknown)",
    )
    # KV-event feed hardening: whose feeds the router follows
    p.add_argument(
        "--trust-kv-endpoints",
        action="store_true",
        help="subscribe to the KV-event host a worker's /server_info names even when it is not "
        "the worker's own host; by default such a worker's events are refused (logged, its "
        "cache view stays empty), so a worker cannot point the router at another machine. "
        "A wildcard host (*, 0.0.0.0, ::) always means the worker's own host",
    )
    p.add_argument(
        "--no-inflight-prefixes",
        action="store_true",
        help="count only what the workers' KV events (or probes) show as cached; by default a "
        "request's prompt pages also count as held by the worker it was sent to while it is in "
        f"flight and for {GRACE_S:g} s after, so that a follow-up or fork sent before those "
        "events arrive (e.g. bench_serving's concurrent Mooncake rounds) finds its holder",
    )
    p.add_argument(
        "--cache-view",
        choices=CACHE_VIEWS,
        default=_D.cache_view,
        help="where per-worker cache hits come from: 'events' (KV-event index) or 'probe' (ask "
        "each healthy worker's POST /smetric/prefix_match per request; needs the patched SGLang "
        "of patches/ or the emulator; no KV-event subscription)",
    )
    p.add_argument(
        "--probe-timeout-secs",
        type=float,
        default=_D.probe_timeout_secs,
        help="probe mode: a worker that has not answered the probe by then counts as hit 0",
    )
    life = p.add_argument_group("lifecycle", "how the router stops")
    life.add_argument(
        "--shutdown-grace-secs",
        type=float,
        default=_D.shutdown_grace_secs,
        help="on SIGTERM/SIGINT: /readiness answers 503 at once (a balancer drains the replica), "
        "new requests get 503, open ones get this many seconds to finish; then a stream still "
        "open is ended with an SSE error event (code router_shutting_down) and a request "
        "still waiting for its worker gets 503, and the router exits 0. A second signal ends "
        "the grace at once. Each --processes replica drains the same way",
    )
    l3 = p.add_argument_group(
        "global KV tier (L3)",
        "Mooncake as HiCache's L3: which prompt pages any worker can load from the shared store",
    )
    l3.add_argument(
        "--l3-view",
        choices=L3_VIEWS,
        default=_D.l3_view,
        help="where L3 hits come from: 'master' asks the Mooncake master's HTTP API "
        "(/batch_query_keys on SGLang's page keys, cached, within --l3-budget-secs; works with "
        "stock SGLang), 'events' reads L3 KV events from workers running the fork's patch "
        "(patches/), 'off' = no L3 figure",
    )
    l3.add_argument(
        "--mooncake-master-url",
        default=None,
        metavar="URL",
        help="http://HOST:PORT of mooncake_master's HTTP port (its --metrics_port), for "
        "--l3-view master",
    )
    l3.add_argument(
        "--l3-key-prefix",
        default=None,
        help="prefix of SGLang's Mooncake keys; default: the served model name with '/' -> '-' "
        "(what SGLang's MooncakeStore uses without --hicache-storage-backend-extra-config "
        "extra_backend_tag)",
    )
    l3.add_argument(
        "--l3-tp-rank",
        type=int,
        default=_D.l3_tp_rank,
        help="TP rank whose keys are asked for (each rank writes its own)",
    )
    l3.add_argument(
        "--l3-budget-secs",
        type=float,
        default=_D.l3_budget_secs,
        help="longest a routing decision waits for the master; a slower answer counts as "
        "'unknown' (never as a miss)",
    )
    l3.add_argument(
        "--l3-cache-ttl-secs",
        type=float,
        default=_D.l3_cache_ttl_secs,
        help="how long a page seen in L3 is trusted without asking the master again",
    )
    l3.add_argument(
        "--l3-aware-guard",
        action="store_true",
        help="smetric: a history evicted from the local tiers but held in L3 stays with its best "
        "local holder, which loads the rest from L3 (reason sticky-l3), instead of being balanced "
        "as the paper's guard does: less L3 traffic, more load on the workers that evicted "
        "(benchmarks/results/l3_guard.md); needs --l3-view",
    )
    up = p.add_argument_group(
        "connections to workers", "bounds, timeouts and retries of the forwarded requests"
    )
    up.add_argument(
        "--max-upstream-connections",
        type=int,
        default=_D.max_upstream_connections,
        metavar="N",
        help="connections to workers open at once, over all workers (each is a file "
        "descriptor, as is each client connection); a request finding all in use waits for "
        "one (within its own timeouts) instead of failing. 0 = half the open-file limit, "
        "which the router raises to its hard limit at start",
    )
    up.add_argument(
        "--retry-on-reset",
        action="store_true",
        help="also retry on another worker a request whose worker dropped the connection "
        "after the request was sent, before answering. Off by default: the worker may have "
        "run it, and a request that crashes a worker would crash the next ones too",
    )
    up.add_argument(
        "--first-byte-timeout-secs",
        type=float,
        default=_D.first_byte_timeout_secs,
        help="longest wait from dispatch to the worker's first response byte, "
        "queueing and prefill included; past it the worker is marked failed and the request "
        "answered 504 (or ended with an SSE error event). Generous by default: a 100K-token "
        "agent prompt prefills in seconds on an idle GPU but queues behind other long "
        "prefills on a busy one. A non-streamed reply's first byte is its whole answer: "
        "past this bound it is awaited while its worker passes its health checks (a hung "
        "SGLang fails them), up to --request-timeout-secs",
    )
    up.add_argument(
        "--stream-idle-timeout-secs",
        type=float,
        default=_D.stream_idle_timeout_secs,
        help="streams: longest silence between two chunks once the first came; past it the "
        "worker is marked failed and the stream ended with an SSE error event. Generous by "
        "default: SGLang may retract a running request under KV-cache pressure and prefill "
        "it again, and tool-call parsers hold text back",
    )
    _add_auth_flags(p)
    _add_responses_flags(p)
    limits = p.add_argument_group(
        "request limits", "what the router refuses (400) before a worker sees it"
    )
    limits.add_argument(
        "--context-length",
        type=int,
        default=None,
        metavar="TOKENS",
        help="the served context length: prompts of this many tokens or more, and a max_tokens "
        "(max_completion_tokens, max_new_tokens) that with the prompt exceeds it, are refused "
        "with 400 as SGLang refuses them; a huge prompt as soon as a prefix shows it too long. "
        "Default: the smallest max_model_len the workers' /v1/models report (unknown: no limit)",
    )
    # Coding agents: what the router reads from their requests
    agents = p.add_argument_group("coding agents", "what the router reads from agents' requests")
    agents.add_argument(
        "--no-session-hints",
        action="store_true",
        help="ignore the session ids coding agents send (x-claude-code-session-id, session_id, "
        "x-session-affinity, x-opencode-session, Anthropic metadata.user_id, OpenAI "
        "prompt_cache_key). By default smetric reads one as a hint only: a session's follow-up "
        "whose cache holder is gone or overloaded goes to the session's home worker (rendezvous "
        "hash of the id) if that one is not overloaded, decision reason session-hint-fallback; "
        "ties among equally good workers go to it too. Turn inference never needs a hint",
    )
    agents.add_argument(
        "--anthropic-thinking",
        choices=ANTHROPIC_THINKING,
        default=_D.anthropic_thinking,
        help="what to do with an Anthropic Messages `thinking` (Claude Code sends one on every "
        "request) when no worker of the model reports a reasoning parser in /server_info: SGLang "
        "refuses it there with a 400. drop (default): forward the request without it and "
        "without context_management's clear_thinking edits, which is how such a worker serves "
        "a request that has none (counted in smetric_anthropic_dropped_total{field}); reject: "
        "forward it as it came, for the workers' own 400",
    )
    return p


# Keys are read from these when the flag is absent: a command line is visible to every local
# user (ps), the environment is not.
API_KEY_ENV = "SMETRIC_API_KEY"
ADMIN_API_KEY_ENV = "SMETRIC_ADMIN_API_KEY"
WORKER_API_KEY_ENV = "SMETRIC_WORKER_API_KEY"


def _add_auth_flags(p: argparse.ArgumentParser) -> None:
    auth = p.add_argument_group(
        "authentication",
        "Clients send keys as 'Authorization: Bearer KEY' (the openai client's api_key). "
        "/health, /liveness, /readiness and /metrics stay open, for probes and Prometheus. "
        "Request bodies must be sent as 'Content-Type: application/json' (else 415).",
    )
    # SUPPRESS (not the environment's value): --help must never print a key
    auth.add_argument(
        "--api-key",
        default=argparse.SUPPRESS,
        metavar="KEY",
        help=f"key the inference endpoints need (generation, /v1/models, GET /workers, "
        f"/smetric/prefix_match); a request without it gets 401; default: ${API_KEY_ENV} (the "
        "environment is not visible to other users as a command line is), else none: open",
    )
    auth.add_argument(
        "--admin-api-key",
        default=argparse.SUPPRESS,
        metavar="KEY",
        help=f"key of the admin endpoints (POST/DELETE /workers, POST /flush_cache): 401 "
        f"without a key, 403 with another; default: ${ADMIN_API_KEY_ENV}; without it, admin "
        "endpoints take the --api-key, and with no key at all only loopback clients (behind a "
        "reverse proxy on this host every client is loopback: set a key there)",
    )
    auth.add_argument(
        "--worker-api-key",
        default=argparse.SUPPRESS,
        metavar="KEY",
        help=f"the workers' key (SGLang's --api-key): sent as 'Authorization: Bearer KEY' on "
        f"forwarded requests and on the router's own calls (health, server_info, loads, flush); "
        f"default: ${WORKER_API_KEY_ENV}, else none; excludes --forward-authorization",
    )
    auth.add_argument(
        "--forward-authorization",
        action="store_true",
        help="pass the client's own Authorization header on to the worker (by default it is "
        "dropped: it holds the router's key, not the worker's)",
    )


def _add_responses_flags(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group(
        "OpenAI Responses",
        "/v1/responses ids the router hands out name the worker that stores the response, "
        "signed, so previous_response_id, GET and cancel reach it without a table.",
    )
    group.add_argument(
        "--response-id-key",
        default=argparse.SUPPRESS,
        metavar="KEY",
        help=f"secret (16+ characters) that signs the response ids; routers that must accept "
        f"each other's ids (replicas behind one address, a restarted router) need the same one; "
        f"default: ${RESPONSE_ID_KEY_ENV}, else a random key per router (its --processes "
        "replicas share it): ids then die with the router process",
    )


def _key(given: str | None, env: str) -> str | None:
    return given if given is not None else os.environ.get(env) or None


def _prefill_specs(given: list[list[str]]) -> tuple[tuple[str, int | None], ...]:
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


def config_from_args(argv: Sequence[str] | None = None) -> RouterConfig:
    parser = build_parser()
    a = parser.parse_args(argv)
    try:
        decode_policy = getattr(a, "decode_policy", None)
        if decode_policy is not None and not a.pd_disaggregation:
            raise ValueError("--decode-policy needs --pd-disaggregation")
        return RouterConfig(
            worker_urls=tuple(a.worker_urls),
            host=a.host,
            port=a.port,
            policy=a.policy,
            policy_params=PolicyParams(
                overload=a.overload,
                overload_slack=a.overload_slack,
                hit_ratio=a.hit_ratio,
                bailian_lambda=a.bailian_lambda,
                cache_threshold=a.cache_threshold,
                balance_abs_threshold=a.balance_abs_threshold,
                balance_rel_threshold=a.balance_rel_threshold,
                l3_aware=a.l3_aware_guard,
            ),
            prometheus_port=a.prometheus_port,
            prometheus_host=a.prometheus_host,
            log_level=a.log_level,
            request_timeout_secs=a.request_timeout_secs,
            tokenizer_path=a.tokenizer_path,
            chat_template=a.chat_template,
            page_size=a.page_size,
            load_poll_interval_secs=a.load_poll_interval_secs,
            health_check_interval_secs=a.health_check_interval_secs,
            health_check_timeout_secs=a.health_check_timeout_secs,
            max_body_bytes=a.max_body_bytes,
            max_retries=a.max_retries,
            kv_events=not a.no_kv_events,
            trust_kv_endpoints=a.trust_kv_endpoints,
            inflight_prefixes=not a.no_inflight_prefixes,
            cache_view=a.cache_view,
            probe_timeout_secs=a.probe_timeout_secs,
            l3_view=a.l3_view,
            mooncake_master_url=a.mooncake_master_url,
            l3_key_prefix=a.l3_key_prefix,
            l3_tp_rank=a.l3_tp_rank,
            l3_budget_secs=a.l3_budget_secs,
            l3_cache_ttl_secs=a.l3_cache_ttl_secs,
            pd_disaggregation=a.pd_disaggregation,
            prefill=_prefill_specs(a.prefill),
            decode_urls=tuple(a.decode),
            prefill_policy=getattr(a, "prefill_policy", None),
            decode_policy=decode_policy or _D.decode_policy,
            prefill_overload_slack=a.prefill_overload_slack,
            pd_handover_timeout_secs=a.pd_handover_timeout_secs,
            processes=a.processes,
            reuse_port=a.reuse_port or a.processes > 1,
            shutdown_grace_secs=a.shutdown_grace_secs,
            max_upstream_connections=a.max_upstream_connections,
            retry_on_reset=a.retry_on_reset,
            first_byte_timeout_secs=a.first_byte_timeout_secs,
            stream_idle_timeout_secs=a.stream_idle_timeout_secs,
            api_key=_key(getattr(a, "api_key", None), API_KEY_ENV),
            admin_api_key=_key(getattr(a, "admin_api_key", None), ADMIN_API_KEY_ENV),
            worker_api_key=_key(getattr(a, "worker_api_key", None), WORKER_API_KEY_ENV),
            forward_authorization=a.forward_authorization,
            context_length=a.context_length,
            session_hints=not a.no_session_hints,
            anthropic_thinking=a.anthropic_thinking,
            response_id_key=_key(getattr(a, "response_id_key", None), RESPONSE_ID_KEY_ENV),
        )
    except ValueError as e:
        parser.error(str(e))


def replica_argv(argv: Sequence[str], port: int) -> list[str]:
    """The command line of one more replica: the same flags on the bound port, without the
    ones that belong to the first process alone."""
    own = {"--processes": 1, "--port": 1, "--port-file": 1, "--prometheus-port": 1}
    out: list[str] = []
    skip = 0
    for arg in argv:
        if skip:
            skip -= 1
            continue
        name = arg.split("=", 1)[0]
        if name in own:
            skip = 0 if "=" in arg else own[name]
            continue
        out.append(arg)
    return [sys.executable, "-m", "smetric_router", *out, "--port", str(port), "--reuse-port"]


# After the shutdown grace: how long ended requests get to write their last answer, and how long
# aiohttp then waits for handlers (its default, 60 s twice, made a shutdown take two minutes).
END_BOUND_S = 5.0


async def drain(state: RouterState, grace: float) -> None:
    """Stop taking requests, let the open ones finish within `grace`, then end the rest."""
    d = state.drain
    d.begin()
    log.info("shutting down: %d requests open, %.1f s to finish", d.open, grace)
    if await d.wait_idle(grace):
        log.info("all requests finished")
        return
    log.warning("shutdown grace over: ending %d open requests", d.end_all())
    await d.wait_idle(END_BOUND_S, can_hurry=False)


def _die_with_parent() -> None:
    """A replica goes when the first process goes, even if that one is killed outright."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


async def serve(
    config: RouterConfig, port_file: str | None = None, argv: Sequence[str] = ()
) -> None:
    """Run until SIGINT/SIGTERM; with port_file, write the bound ports there once listening.
    With config.processes > 1, also start the other replicas (argv: this process's flags) on
    the port this one bound, and stop them on the way out."""
    from smetric_router.router.app import RUNNER_OPTIONS, build_app, metrics_app
    from smetric_router.router.assemble import make_state

    state = make_state(config)
    options = {**RUNNER_OPTIONS, "shutdown_timeout": END_BOUND_S}
    runners = [web.AppRunner(build_app(state), **options)]
    replicas: list[subprocess.Popen[bytes]] = []
    if config.prometheus_port is not None:
        runners.append(web.AppRunner(metrics_app(state), **options))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():  # a second signal: no more grace
            state.drain.hurry()
        stop.set()
        # the replicas drain alongside (they sit in their own process group, so a Ctrl-C
        # reaches them once, from here)
        for p in replicas:
            if p.poll() is None:
                p.terminate()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    try:
        await runners[0].setup()
        await web.TCPSite(
            runners[0], config.host, config.port, reuse_port=config.reuse_port or None
        ).start()
        if len(runners) > 1:
            await runners[1].setup()
            assert config.prometheus_port is not None
            await web.TCPSite(runners[1], config.prometheus_host, config.prometheus_port).start()
        ports = {"http": bound_port(runners[0])}
        if len(runners) > 1:
            ports["prometheus"] = bound_port(runners[1])
        for _ in range(config.processes - 1):
            replicas.append(
                subprocess.Popen(
                    replica_argv(argv, ports["http"]),
                    # one key for all replicas: each accepts the response ids the others issue
                    env={**os.environ, RESPONSE_ID_KEY_ENV: state.response_ids.key_text},
                    preexec_fn=_die_with_parent,
                    process_group=0,
                )
            )
        if port_file is not None:
            write_port_file(port_file, ports)
        if config.pd_disaggregation:
            log.info(
                "smetric-router on http://%s:%d, PD: %d prefill (%s), %d decode (%s)",
                config.host,
                ports["http"],
                len(config.prefill),
                config.prefill_policy_name,
                len(config.decode_urls),
                config.decode_policy,
            )
        else:
            log.info(
                "smetric-router on http://%s:%d, policy %s, %d workers",
                config.host,
                ports["http"],
                config.policy,
                len(config.worker_urls),
            )
        log.info("auth: %s", describe(config.auth()))
        if replicas:
            log.info("%d more router processes on port %d", len(replicas), ports["http"])
        await stop.wait()
        await drain(state, config.shutdown_grace_secs)
    finally:
        for p in replicas:
            if p.poll() is None:
                p.terminate()
        # they drained alongside this process: a little longer than its own end takes
        deadline = loop.time() + 2 * END_BOUND_S
        while any(p.poll() is None for p in replicas) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        for p in replicas:
            if p.poll() is None:
                log.warning("router process %d did not stop; killing it", p.pid)
                p.kill()
            p.wait()
        for r in reversed(runners):
            await r.cleanup()


def main(argv: Sequence[str] | None = None) -> None:
    raw = list(sys.argv[1:] if argv is None else argv)
    config = config_from_args(raw)
    port_file = build_parser().parse_args(raw).port_file
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    raise_open_files_limit()  # before any connection: the limit bounds them all
    try:
        try:
            import uvloop
        except ImportError:
            asyncio.run(serve(config, port_file, raw))
        else:
            uvloop.run(serve(config, port_file, raw))
    except (OSError, ValueError) as e:  # bad tokenizer, page-size mismatch, busy port
        log.error("smetric-router failed to start: %s", e)
        sys.exit(1)
