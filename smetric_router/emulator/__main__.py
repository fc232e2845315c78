"""python -m smetric_router.emulator: run one emulated SGLang worker."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from dataclasses import replace

from aiohttp import web

from smetric_router.core.port_file import bound_port, write_port_file
from smetric_router.emulator.config import (
    DEFAULT_BOOTSTRAP_PORT,
    DEFAULT_DECODE_KV_TIMEOUT_S,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_MODEL_NAME,
    DEFAULT_OPENAI_MAX_TOKENS,
    DEFAULT_TRANSFER_GBPS,
    GLOBAL_TIERS,
    NOTICE,
    ROLES,
    SGLANG_VERSION,
    EmulatorConfig,
)
from smetric_router.emulator.kv_config import KvEventsConfig
from smetric_router.emulator.mooncake_tier import MooncakeTier, TierError, TierOptions, open_tier
from smetric_router.emulator.server import EMULATOR, make_app, start_server
from smetric_router.emulator.tokenizer import DEFAULT_TOKENIZER_DIR, load_tokenizer
from smetric_router.engine.api import EngineConfig
from smetric_router.engine.engine import Engine

log = logging.getLogger("smetric_router.emulator")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    d = EngineConfig()
    p = argparse.ArgumentParser(
        prog="python -m smetric_router.emulator",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=(
            f"An {NOTICE}. Speaks SGLang {SGLANG_VERSION}'s HTTP API (/generate, "
            "/v1/chat/completions, /v1/completions, /health, /server_info, /v1/loads, /metrics, "
            f"/flush_cache) and KV-event ZMQ feed. Answers end at a natural length drawn from a "
            "production trace, at most max_new_tokens (default "
            f"{DEFAULT_MAX_NEW_TOKENS}) on /generate, max_tokens (default "
            f"{DEFAULT_OPENAI_MAX_TOKENS}; chats: the context) on the OpenAI endpoints; with "
            "ignore_eos exactly that many, a chat answer's last token being <|im_end|>. Offered "
            "tools get harmless Qwen3-Coder calls. POST /emulator/faults injects faults for tests."
        ),
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=30000, help="HTTP port; 0 = any free port")
    p.add_argument(
        "--port-file",
        default=None,
        metavar="PATH",
        help="after binding, write the bound ports here as JSON (http, kv_events, "
        "kv_events_replay, bootstrap): how a launcher learns ports given as 0",
    )
    p.add_argument("--model-name", default=DEFAULT_MODEL_NAME, help="served model name")
    p.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="as SGLang's --api-key: every endpoint but /health*, /ready* and /metrics* then "
        "needs 'Authorization: Bearer KEY' (401 otherwise)",
    )
    p.add_argument(
        "--tokenizer-path",
        default=None,
        help="HF tokenizer (or model) directory, read offline; unset = the bundled one",
    )
    p.add_argument(
        "--chat-template",
        default=None,
        help="a Jinja chat template file (.jinja) used instead of the tokenizer's own, read as "
        "SGLang reads its --chat-template",
    )
    p.add_argument("--page-size", type=int, default=d.page_size, help="KV page size in tokens")
    p.add_argument(
        "--kv-events-port", type=int, default=None, help="ZMQ PUB port (0 = any); off if unset"
    )
    p.add_argument(
        "--kv-events-replay-port", type=int, default=None, help="ZMQ replay (ROUTER) port (0 = any)"
    )
    p.add_argument("--kv-events-topic", default="", help="topic of the KV-event frames")
    p.add_argument(
        "--kv-events-config",
        default=None,
        help="SGLang's KV-event JSON instead of the --kv-events-* ports, e.g. "
        '\'{"publisher":"zmq","endpoint":"tcp://127.0.0.1:5557","bind":true}\'; as in SGLang the '
        'PUB socket binds only with "bind": true or a wildcard host (tcp://*:P), else it '
        "connects to the endpoint",
    )
    p.add_argument("--profile", default=d.profile, help="engine timing profile name")
    p.add_argument(
        "--gpu-kv-tokens", type=int, default=d.gpu_kv_tokens, help="GPU-tier KV capacity (tokens)"
    )
    p.add_argument(
        "--host-kv-tokens",
        type=int,
        default=d.host_kv_tokens,
        help="HiCache host-tier KV capacity (tokens); 0 = no host tier",
    )
    p.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="the model's context length (SGLang's --context-length), reported as /v1/models "
        "max_model_len; prompts that reach it, and max_tokens that with the prompt exceed it, "
        "are refused with 400 as SGLang refuses them; unset = the GPU-tier KV capacity",
    )
    p.add_argument("--speedup", type=float, default=1.0, help="model seconds per wall second")
    p.add_argument(
        "--max-running-requests",
        type=int,
        default=d.max_running_requests,
        help="batch size limit",
    )
    p.add_argument(
        "--chunked-prefill-size",
        type=int,
        default=d.chunked_prefill_size,
        help="new prompt tokens computed per step",
    )
    pd = p.add_argument_group(
        "PD disaggregation",
        "prefill: computes the prompt, answers with the first token and offers the KV under the "
        "request's bootstrap_room on its bootstrap port; decode: fetches that KV from "
        "bootstrap_host:bootstrap_port, waits the modelled transfer, then decodes the answer",
    )
    pd.add_argument(
        "--role",
        "--disaggregation-mode",
        dest="role",
        choices=ROLES,
        default="null",
        help="null = colocated (default)",
    )
    pd.add_argument(
        "--disaggregation-bootstrap-port",
        type=int,
        default=DEFAULT_BOOTSTRAP_PORT,
        help="prefill: port of the KV handover endpoint (0 = any free port)",
    )
    pd.add_argument(
        "--transfer-gbps",
        type=float,
        default=DEFAULT_TRANSFER_GBPS,
        help="decode: modelled prefill -> decode KV link in Gbit/s (scaled by --speedup)",
    )
    pd.add_argument(
        "--decode-kv-timeout-secs",
        type=float,
        default=DEFAULT_DECODE_KV_TIMEOUT_S,
        help="decode: wall seconds to wait for a request's KV before failing it",
    )
    t = TierOptions()
    gt = p.add_argument_group(
        "global KV tier",
        "mooncake: HiCache's L3 in a real Mooncake store, under SGLang's keys; the client is set "
        "up from the MOONCAKE_* environment SGLang's MooncakeStore reads (MOONCAKE_MASTER, "
        "MOONCAKE_TE_META_DATA_SERVER, MOONCAKE_PROTOCOL, MOONCAKE_DEVICE, "
        "MOONCAKE_GLOBAL_SEGMENT_SIZE, MOONCAKE_LOCAL_HOSTNAME; MC_TCP_BIND_ADDRESS for tcp)",
    )
    gt.add_argument(
        "--global-tier",
        choices=GLOBAL_TIERS,
        default="none",
        help="the engine's global KV tier (not on a decode instance)",
    )
    gt.add_argument(
        "--mooncake-payload-bytes",
        type=int,
        default=t.payload_bytes,
        help="bytes stored per page and K/V object (scaled down: the fetch time is modelled)",
    )
    gt.add_argument(
        "--mooncake-query-timeout-secs",
        type=float,
        default=t.query_timeout_s,
        help="the longest a request waits for the store to say which of its pages it holds "
        "(then it is served as a miss)",
    )
    gt.add_argument(
        "--mooncake-connect-timeout-secs",
        type=float,
        default=t.connect_timeout_s,
        help="start-up fails when the master's RPC port does not answer within this",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = p.parse_args(argv)
    if args.global_tier == "mooncake":
        if args.role == "decode":
            p.error("--global-tier mooncake: a decode instance has no HiCache storage tier")
        if args.mooncake_payload_bytes <= 0 or args.mooncake_query_timeout_secs <= 0:
            p.error("--mooncake-payload-bytes and --mooncake-query-timeout-secs must be positive")
    if args.speedup <= 0:
        p.error("--speedup must be positive")
    if args.transfer_gbps <= 0 or args.decode_kv_timeout_secs <= 0:
        p.error("--transfer-gbps and --decode-kv-timeout-secs must be positive")
    if args.kv_events_replay_port is not None and args.kv_events_port is None:
        p.error("--kv-events-replay-port needs --kv-events-port")
    if args.kv_events_config is not None:
        if args.kv_events_port is not None:
            p.error("--kv-events-config and --kv-events-port are alternatives; give one")
        try:
            KvEventsConfig.from_json(args.kv_events_config)
        except ValueError as exc:
            p.error(str(exc))
    return args


def config_from_args(args: argparse.Namespace) -> EmulatorConfig:
    return EmulatorConfig(
        host=args.host,
        port=args.port,
        model_name=args.model_name,
        tokenizer_path=str(args.tokenizer_path or DEFAULT_TOKENIZER_DIR),
        chat_template=args.chat_template,
        kv_events_port=args.kv_events_port,
        kv_events_replay_port=args.kv_events_replay_port,
        kv_events_topic=args.kv_events_topic,
        kv_events_config=args.kv_events_config,
        speedup=args.speedup,
        role=args.role,
        bootstrap_port=args.disaggregation_bootstrap_port,
        transfer_gbps=args.transfer_gbps,
        decode_kv_timeout_s=args.decode_kv_timeout_secs,
        context_length=args.context_length,
        global_tier=args.global_tier,
        api_key=args.api_key,
        mooncake=TierOptions(
            payload_bytes=args.mooncake_payload_bytes,
            query_timeout_s=args.mooncake_query_timeout_secs,
            connect_timeout_s=args.mooncake_connect_timeout_secs,
        ),
        engine=EngineConfig(
            page_size=args.page_size,
            gpu_kv_tokens=args.gpu_kv_tokens,
            host_kv_tokens=args.host_kv_tokens,
            chunked_prefill_size=args.chunked_prefill_size,
            max_running_requests=args.max_running_requests,
            profile=args.profile,
        ),
    )


def with_bound_ports(config: EmulatorConfig, ports: dict[str, int]) -> EmulatorConfig:
    """The config with every port as bound (those given as 0 are the OS's choice)."""
    config = replace(config, port=ports["http"])
    if "bootstrap" in ports:
        config = replace(config, bootstrap_port=ports["bootstrap"])
    if config.kv_events_config is None and config.kv_events_port is not None:
        config = replace(
            config,
            kv_events_port=ports["kv_events"],
            kv_events_replay_port=ports.get("kv_events_replay"),
        )
    return config


async def start_bound(app: web.Application) -> tuple[web.AppRunner, dict[str, int]]:
    """Serve an emulator app on its config's ports; those given as 0 are bound by the OS. Its
    config then holds the ports as bound (so /server_info reports them); returns the runner and
    the ports by name (http, kv_events, kv_events_replay, bootstrap)."""
    em = app[EMULATOR]
    runner = await start_server(app, em.config.host, em.config.port)
    ports = {"http": bound_port(runner), **em.bound_ports()}
    em.config = with_bound_ports(em.config, ports)
    return runner, ports


async def serve(config: EmulatorConfig, port_file: str | None = None) -> None:
    tokenizer = load_tokenizer(config.tokenizer_path, config.chat_template)
    tier: MooncakeTier | None = None
    if config.global_tier == "mooncake":
        tier = await open_tier(config.model_name, config.engine.page_size, config.mooncake)
    app = make_app(config, Engine(config.engine, tier), tokenizer, tier)
    runner, ports = await start_bound(app)
    if port_file is not None:
        write_port_file(port_file, ports)
    log.info("%s; serving http://%s:%d", NOTICE, config.host, ports["http"])
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = config_from_args(args)
    try:
        import uvloop
    except ImportError:
        run = asyncio.run
    else:
        run = uvloop.run
    try:
        run(serve(config, args.port_file))
    except TierError as exc:
        sys.exit(f"emulated worker: {exc}")


if __name__ == "__main__":
    main()
