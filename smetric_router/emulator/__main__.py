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

from smetric_router.core.flags import DefaultsHelpFormatter, add_flags, values
from smetric_router.core.port_file import bound_port, write_port_file
from smetric_router.emulator.config import (
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_OPENAI_MAX_TOKENS,
    FLAG_GROUPS,
    NOTICE,
    SGLANG_VERSION,
    EmulatorConfig,
)
from smetric_router.emulator.kv_config import KvEventsConfig
from smetric_router.emulator.mooncake_tier import MooncakeTier, TierError, open_tier
from smetric_router.emulator.server import EMULATOR, make_app, start_server
from smetric_router.emulator.tokenizer import DEFAULT_TOKENIZER_DIR, load_tokenizer
from smetric_router.engine.engine import Engine

log = logging.getLogger("smetric_router.emulator")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m smetric_router.emulator",
        formatter_class=DefaultsHelpFormatter,
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
    add_flags(p, EmulatorConfig, FLAG_GROUPS)
    p.add_argument(
        "--port-file",
        metavar="PATH",
        help="after binding, write the bound ports here as JSON (http, kv_events, "
        "kv_events_replay, bootstrap): how a launcher learns ports given as 0",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log level",
    )
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if args.global_tier == "mooncake":
        if args.role == "decode":
            p.error("--global-tier mooncake: a decode instance has no HiCache storage tier")
        if args.payload_bytes <= 0 or args.query_timeout_s <= 0:
            p.error("--mooncake-payload-bytes and --mooncake-query-timeout-secs must be positive")
    if args.l3_kv_events and (args.global_tier != "mooncake" or args.role == "decode"):
        p.error("--l3-kv-events needs --global-tier mooncake (the store whose pages it announces)")
    if args.l3_kv_events and args.kv_events_port is None and args.kv_events_config is None:
        p.error("--l3-kv-events needs KV events (--kv-events-port or --kv-events-config)")
    if args.speedup <= 0:
        p.error("--speedup must be positive")
    if args.transfer_gbps <= 0 or args.decode_kv_timeout_s <= 0:
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
    fields = values(EmulatorConfig, args)
    # the bundled tokenizer's place is the tokenizer module's to know, not the config's
    fields["tokenizer_path"] = fields["tokenizer_path"] or str(DEFAULT_TOKENIZER_DIR)
    return EmulatorConfig(**fields)


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
