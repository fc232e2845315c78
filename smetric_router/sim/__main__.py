"""python -m smetric_router.sim: replay a trace through policies on a simulated cluster.

Example (the Mooncake conversation trace, four policies, a rate sweep):

    python -m smetric_router.sim --trace ../shared/traces/mooncake-conversation.jsonl \\
        --policies smetric,bailian,lmetric,load_balance --rate-scale 1,1.5,2 --json out.json

The rate is controlled by stretching time (--rate-scale), or as the paper does by keeping a
fraction of the sessions at their original timing (--sample-sessions SEED --rate-scale 0.3,0.45).
Every (global ratio, policy, rate scale) combination is one independent run with the same seed.
With --pd, the runs simulate PD disaggregation's prefill instances instead (sim/pd.py): rows then
report prefill TPS (prompt tokens) and TTFT to prefill completion.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from smetric_router.core.flags import RawDescriptionDefaultsHelpFormatter, add_flags, values
from smetric_router.policies.base import make_policy, policy_names
from smetric_router.sim.cluster import Cluster
from smetric_router.sim.config import SimConfig
from smetric_router.sim.metrics import summarize
from smetric_router.sim.pd import (
    PdCluster,
    summarize_pd,
    trace_pages,
)
from smetric_router.sim.report import document, plots, table
from smetric_router.traces.loaders import TraceError, load_trace
from smetric_router.traces.sample import sample_sessions
from smetric_router.traces.schema import TraceRequest

_PROGRESS_MIN_REQUESTS = 20_000  # runs shorter than this finish in seconds: no bar


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one number")
    return values


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m smetric_router.sim",
        description=__doc__,
        formatter_class=RawDescriptionDefaultsHelpFormatter,
    )
    p.add_argument("--trace", required=True, help="trace file (JSON lines)")
    p.add_argument(
        "--format",
        choices=("auto", "bailian", "mooncake"),
        default="auto",
        help="trace schema; auto reads the first record",
    )
    p.add_argument("--block-size", type=int, default=16, help="Bailian hash_ids block size")
    p.add_argument(
        "--limit", type=int, default=0, help="replay only the first N requests (0 = all)"
    )
    p.add_argument(
        "--policies",
        default="smetric,bailian,lmetric,lmetric-inflight,load_balance",
        help=f"comma-separated, of: {', '.join(policy_names())}",
    )
    p.add_argument(
        "--rate-scale",
        type=_floats,
        default=[1.0],
        help="arrival times are divided by this; a comma list sweeps",
    )
    p.add_argument(
        "--sample-sessions",
        type=int,
        default=None,
        metavar="SEED",
        help="control the rate the paper's way instead of stretching time: each --rate-scale "
        "value R <= 1 keeps a fraction R of the sessions (drawn with this seed), whole and at "
        "their original timing",
    )
    p.add_argument(
        "--global-ratio",
        type=_floats,
        default=[math.inf],
        help="global-tier capacity x the cluster's total GPU KV, in both tier modes "
        "(inf = fully provisioned, never binds; 0 = none); a comma list sweeps",
    )
    add_flags(p, SimConfig)
    # PD mode (sim/pd.py)
    p.add_argument(
        "--pd", action="store_true", help="PD disaggregation: simulate the prefill instances only"
    )
    p.add_argument("--json", type=Path, default=None, help="write the results document here")
    p.add_argument("--plots", type=Path, default=None, help="write PNG plots into this folder")
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bar (shown on long runs)"
    )
    return p


def _progress(total: int, enabled: bool) -> tuple[Callable[[int], None] | None, Callable[[], None]]:
    if not enabled or total < _PROGRESS_MIN_REQUESTS:
        return None, lambda: None
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm comes with the [bench] extra
        return None, lambda: None
    bar = tqdm(total=total, unit="req", file=sys.stderr, mininterval=1.0)
    return bar.update, bar.close


def run(
    trace: Sequence[TraceRequest],
    policies: Sequence[str],
    rate_scales: Sequence[float],
    global_ratios: Sequence[float],
    cfg: SimConfig,
    progress: Callable[[int], None] | None = None,
    pd: bool = False,
    sample_seed: int | None = None,
) -> list[dict[str, Any]]:
    """sample_seed: each
    rate scale is the fraction of sessions kept (traces/sample.py), replayed at scale 1."""
    # per rate scale, once for every run at it: the requests replayed, the clock's stretch and
    # (PD) their pages
    replays: list[tuple[Sequence[TraceRequest], float, list[np.ndarray] | None]] = []
    whole = trace_pages(trace, cfg.page_size) if pd and sample_seed is None else None
    for scale in rate_scales:
        if sample_seed is None:
            replays.append((trace, scale, whole))
        else:
            kept = sample_sessions(trace, scale, sample_seed)
            replays.append((kept, 1.0, trace_pages(kept, cfg.page_size) if pd else None))
    rows = []
    for ratio in global_ratios:
        for name in policies:
            for scale, (reqs, stretch, pages) in zip(rate_scales, replays, strict=True):
                policy = make_policy(name, cfg.params)
                if pd:
                    pd_result = PdCluster(cfg, policy, ratio).run(reqs, stretch, progress, pages)
                    rows.append(summarize_pd(pd_result, cfg.slo, name, scale, ratio))
                    continue
                result = Cluster(cfg, policy, ratio).run(reqs, stretch, progress)
                rows.append(summarize(result, cfg.slo, name, scale, ratio))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    try:
        cfg = SimConfig(**values(SimConfig, args))
        for name in policies:
            if make_policy(name, cfg.params).uses_text_tree and args.pd:
                raise ValueError(f"policy {name!r} (text tree) is not modelled under --pd")
        if args.pd and cfg.follow_ups != "trace":
            raise ValueError(f"--follow-ups {cfg.follow_ups} is not modelled under --pd")
        if args.pd and cfg.max_concurrent_requests:
            raise ValueError("--max-concurrent-requests is not modelled under --pd")
        for r in args.rate_scale:
            if r <= 0:
                raise ValueError(f"--rate-scale values must be > 0, got {r:g}")
            if args.sample_sessions is not None and r > 1:
                raise ValueError(f"--sample-sessions: a rate scale is a fraction <= 1, got {r:g}")
        for g in args.global_ratio:
            replace(cfg, global_ratio=g)  # validates
        trace = load_trace(args.trace, args.format, args.block_size)
    except (TraceError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.limit > 0:
        trace = trace[: args.limit]
    if not trace:
        print("error: the trace has no requests", file=sys.stderr)
        return 2
    per_rate = [
        len(trace) if args.sample_sessions is None
        else len(sample_sessions(trace, r, args.sample_sessions))
        for r in args.rate_scale
    ]  # fmt: skip
    runs = len(policies) * len(args.global_ratio)
    update, close = _progress(runs * sum(per_rate), not args.no_progress)
    try:
        rows = run(
            trace,
            policies,
            args.rate_scale,
            args.global_ratio,
            cfg,
            update,
            args.pd,
            args.sample_sessions,
        )
    finally:
        close()
    print(table(rows))
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(document(rows), option=orjson.OPT_INDENT_2))
    if args.plots is not None:
        for path in plots(rows, args.plots):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
