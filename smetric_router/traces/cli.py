"""Command line: `python -m smetric_router.traces load|generate|stats ...`.

    python -m smetric_router.traces load ../shared/traces/mooncake-conversation.jsonl
    python -m smetric_router.traces generate --sessions 2000 --seed 1 --out agentic.jsonl
    python -m smetric_router.traces stats agentic.jsonl --instances 32 --json stats.json

A trace that cannot be read is reported as `FILE:LINE: reason` on stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import orjson

from smetric_router.traces.generate import WARMUP_S, GenConfig, generate
from smetric_router.traces.loaders import FORMATS, load_trace
from smetric_router.traces.stats import compute_stats, format_table


def _add_format_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", help="JSONL trace file")
    p.add_argument(
        "--format",
        choices=("auto", *FORMATS),
        default="auto",
        help="file schema (default: detected from the first line)",
    )
    p.add_argument(
        "--block-size",
        type=int,
        default=16,
        help="tokens per hash id in a Bailian-schema file (default 16; Mooncake is always 512)",
    )


def _cmd_load(args: argparse.Namespace) -> None:
    reqs = load_trace(args.trace, args.format, block_size=args.block_size)
    sessions = Counter(r.session for r in reqs)
    span = reqs[-1].arrival_s - reqs[0].arrival_s
    print(f"requests      {len(reqs)}")
    print(f"sessions      {len(sessions)} (largest {max(sessions.values())} requests)")
    print(f"follow-ups    {sum(r.turn > 0 for r in reqs)}")
    print(f"span          {span:.1f} s")
    print(f"block size    {reqs[0].block_size}")
    print(f"input tokens  mean {sum(r.input_len for r in reqs) / len(reqs):.0f}")


def _cmd_generate(args: argparse.Namespace) -> None:
    cfg = GenConfig(
        sessions=args.sessions,
        seed=args.seed,
        duration_s=args.duration_s,
        warmup_s=args.warmup_s,
        lead_in_s=args.lead_in_s,
        block_size=args.block_size,
        instances=args.instances,
        rpm_per_instance=args.rpm_per_instance,
    )
    t0 = time.perf_counter()
    n = generate(cfg, args.out)
    print(
        f"wrote {n} requests (window of {cfg.sessions} root sessions) to {args.out} "
        f"in {time.perf_counter() - t0:.1f} s"
    )


# ../shared/traces beside the repository (the repository's parent holds shared/).
MOONCAKE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "mooncake-conversation.jsonl"


def _cmd_stats(args: argparse.Namespace) -> None:
    reqs = load_trace(args.trace, args.format, args.block_size)
    st = compute_stats(reqs, args.instances, args.from_s)
    ref = None
    if args.compare == "auto":
        args.compare = str(MOONCAKE) if MOONCAKE.exists() else "none"
    if args.compare != "none":
        ref = compute_stats(load_trace(args.compare), args.instances)
    print(format_table(st, ref, Path(args.compare).stem if ref else ""))
    if args.json:
        doc = {**st.to_dict(), **({"compare": ref.to_dict()} if ref else {})}
        Path(args.json).write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))


def _positive_int(v: str) -> int:
    n = int(v)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m smetric_router.traces",
        description="Load, generate and characterize request traces (Bailian, Mooncake).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("load", help="parse a trace, infer sessions, print a summary")
    _add_format_args(p)
    p.set_defaults(run=_cmd_load)

    p = sub.add_parser(
        "generate",
        help="write an agentic trace (Bailian schema + trigger)",
        description="Write an agentic trace in the Bailian schema plus a `trigger` field, "
        "calibrated to the paper's §3 findings and published agentic traces, written as a "
        "steady-state window (see smetric_router.traces.generate).",
    )
    p.add_argument(
        "--sessions",
        type=_positive_int,
        required=True,
        help="root sessions starting inside the window (~50 requests each in steady state)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed, same file)")
    p.add_argument("--out", required=True, help="output JSONL file")
    p.add_argument(
        "--duration-s",
        type=float,
        default=None,
        help="length of the written window, over which the root sessions start (Poisson); "
        "default: set so the steady rate is --rpm-per-instance x --instances",
    )
    p.add_argument(
        "--warmup-s",
        type=float,
        default=WARMUP_S,
        help="sessions also start this long before the window, so the window is a steady state; "
        "their requests before it are not written (default %(default)g s; 0: all sessions start "
        "in the window, which then begins with young sessions)",
    )
    p.add_argument(
        "--lead-in-s",
        type=float,
        default=0.0,
        help="also write the last this-many seconds of the warm-up, shifting timestamps so the "
        "window starts here: a replay can warm its caches on them and measure from this time "
        "(`stats --from-s`); at most --warmup-s (default %(default)g: the file is the window)",
    )
    p.add_argument(
        "--block-size", type=_positive_int, default=16, help="tokens per hash id (default 16)"
    )
    p.add_argument(
        "--instances",
        type=_positive_int,
        default=32,
        help="cluster size for the default rate (default 32)",
    )
    p.add_argument(
        "--rpm-per-instance",
        type=float,
        default=43.0,
        help="target requests per minute per instance for the default duration (default 43: "
        "the paper's Trace 1)",
    )
    p.set_defaults(run=_cmd_generate)

    p = sub.add_parser(
        "stats",
        help="the paper's workload characterization of a trace",
        description="Reuse ratio (infinite prefix store) split intra-session / system prompt / "
        "other inter-session, reuse-interval CDF points, trigger mix, requests per minute per "
        "instance, token share of the top 3 %% of sessions (see smetric_router.traces.stats).",
    )
    _add_format_args(p)
    p.add_argument(
        "--instances", type=_positive_int, default=32, help="cluster size for requests/min/instance"
    )
    p.add_argument(
        "--from-s",
        type=float,
        default=0.0,
        help="characterize the requests arriving from this time on; earlier ones only fill the "
        "store (a generated trace's --lead-in-s; default %(default)g: all requests)",
    )
    p.add_argument(
        "--compare",
        default="auto",
        metavar="TRACE|auto|none",
        help="a second trace whose statistics get their own column (format detected); 'auto' "
        "(default): Mooncake's conversation trace at ../shared/traces/mooncake-conversation.jsonl "
        "when that file exists; 'none': no second column. The paper's column is always shown",
    )
    p.add_argument("--json", metavar="OUT", help="also write the numbers as JSON")
    p.set_defaults(run=_cmd_stats)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except ValueError as exc:  # TraceError, or options the generator or stats refuse
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
