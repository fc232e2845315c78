"""`smetric-router` / `python -m smetric_router`: flags -> RouterConfig -> a running router.

The flags are declared on RouterConfig's fields (router/config.py); this module adds the few
that are not settings (--port-file) and the checks that need to know what was given. Flag names
follow `python -m sglang_router.launch_router` where the meaning is the same, so the router is a
drop-in replacement.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from smetric_router.core import tracing
from smetric_router.core.flags import DefaultsHelpFormatter, add_flags, values
from smetric_router.discovery.base import DiscoveryError
from smetric_router.router.config import FLAG_GROUPS, RouterConfig
from smetric_router.router.limits import raise_open_files_limit
from smetric_router.router.serve import serve

log = logging.getLogger("smetric_router.router")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# with --enable-trace: the trace id of the request a line is about ("-" when none)
TRACED_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [trace_id=%(trace_id)s]: %(message)s"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="smetric-router",
        description="SMetric balanced session-centric router for SGLang workers (OpenAI and "
        "SGLang /generate APIs). Flags match sglang_router.launch_router where they mean the same.",
        formatter_class=DefaultsHelpFormatter,
    )
    add_flags(p, RouterConfig, FLAG_GROUPS)
    p.add_argument(
        "--port-file",
        metavar="PATH",
        help="once listening, write the bound ports here as JSON (http, and prometheus with "
        "--prometheus-port): how a launcher learns a port given as 0",
    )
    return p


def parse(argv: Sequence[str] | None = None) -> tuple[RouterConfig, argparse.Namespace]:
    """The config the flags give, and the namespace (for the flags that are not settings)."""
    parser = build_parser()
    a = parser.parse_args(argv)
    try:
        if a.decode_policy is not None and not a.pd_disaggregation:
            raise ValueError("--decode-policy needs --pd-disaggregation")
        if a.replica_sync_bind is not None and a.processes > 1:
            raise ValueError(
                "--replica-sync-bind is for replicas started one by one; --processes replicas "
                "sync among themselves over ipc (give one or the other)"
            )
        fields = values(RouterConfig, a)
        # replicas share the port the first process binds
        fields["reuse_port"] = a.reuse_port or a.processes > 1
        return RouterConfig(**fields), a
    except ValueError as e:
        parser.error(str(e))


def config_from_args(argv: Sequence[str] | None = None) -> RouterConfig:
    return parse(argv)[0]


def main(argv: Sequence[str] | None = None) -> None:
    raw = list(sys.argv[1:] if argv is None else argv)
    config, args = parse(raw)
    logging.basicConfig(level=config.log_level.upper(), format=LOG_FORMAT)
    if config.enable_trace:
        tracing.log_trace_ids(TRACED_LOG_FORMAT)
    raise_open_files_limit()  # before any connection: the limit bounds them all
    try:
        try:
            import uvloop
        except ImportError:
            asyncio.run(serve(config, args.port_file, raw))
        else:
            uvloop.run(serve(config, args.port_file, raw))
    # bad tokenizer, page-size mismatch, busy port, no Kubernetes credentials
    except (OSError, ValueError, DiscoveryError) as e:
        log.error("smetric-router failed to start: %s", e)
        sys.exit(1)
