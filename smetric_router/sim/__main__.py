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

from smetric_router.engine.timing import PROFILES_DIR
from smetric_router.policies.base import PolicyParams, make_policy, policy_names
from smetric_router.sim.cluster import Cluster
from smetric_router.sim.config import PREFETCH_POLICIES, TIER_MODES, SimConfig, Slo
from smetric_router.sim.metrics import summarize
from smetric_router.sim.pd import (
    PREFILL_OVERLOAD_SLACK,
    PdCluster,
    pd_params,
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


class _Help(argparse.RawDescriptionHelpFormatter):
    """The module docstring as written, and each option's default where it has one."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default is None or action.default is False or action.required:
            return text
        default = action.default
        if isinstance(default, list):
            default = ",".join(f"{v:g}" for v in default)
        return f"{text} (default: {default})".strip()


def parser() -> argparse.ArgumentParser:
    d, slo, sim_defaults = PolicyParams(), Slo(), SimConfig()
    profiles = sorted(f.stem for f in PROFILES_DIR.glob("*.json"))
    p = argparse.ArgumentParser(
        prog="python -m smetric_router.sim", description=__doc__, formatter_class=_Help
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
    p.add_argument("--instances", type=int, default=32, help="serving instances (GPUs)")
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
    p.add_argument(
        "--tier-mode",
        choices=TIER_MODES,
        default=sim_defaults.tier_mode,
        help="paper: GPU tier + global tier over RDMA (no private host tier; a global fetch "
        "stalls the batch, as vLLM + LMCache); hicache: SGLang HiCache, L1 GPU + L2 host "
        "(local) + L3 Mooncake prefetched while the request is queued",
    )
    p.add_argument(
        "--nics-per-server",
        type=int,
        default=sim_defaults.nics_per_server,
        help="NICs per server (of --gpus-per-server instances); the server's global-tier reads "
        "and writes share them",
    )
    p.add_argument(
        "--nic-gbytes-per-s",
        type=float,
        default=sim_defaults.nic_bytes_per_s / 1e9,
        help="achieved GB/s per NIC (21.75: Mooncake's 87 GB/s over 4 x 200 Gbps RoCE)",
    )
    p.add_argument(
        "--gpus-per-server",
        type=int,
        default=sim_defaults.gpus_per_server,
        help="instances per server (they share its NICs)",
    )
    p.add_argument(
        "--network-fraction",
        type=float,
        default=None,
        help="share of a global-tier page's bytes that crosses the network "
        "(default: 1 - 1/servers, pages spread evenly over the servers' memory)",
    )
    p.add_argument(
        "--fetch-overhead-ms",
        type=float,
        default=sim_defaults.fetch_overhead_s * 1e3,
        help="fixed cost per global-tier fetch, ms (LMCache lookups take 1-2 ms)",
    )
    p.add_argument(
        "--prefetch-policy",
        choices=PREFETCH_POLICIES,
        default=sim_defaults.prefetch_policy,
        help="--tier-mode hicache: when an L3 prefetch stops (SGLang "
        "--hicache-storage-prefetch-policy: take what arrived / wait for all / wait up to "
        "1 s + 0.25 s per 1K tokens)",
    )
    p.add_argument(
        "--profile",
        default="h20-qwen3-coder-30b-a3b",
        choices=profiles,
        help="timing profile of an instance (engine/profiles)",
    )
    p.add_argument("--gpu-kv-tokens", type=int, default=None, help="default: the profile's")
    p.add_argument(
        "--host-kv-tokens",
        type=int,
        default=None,
        help="--tier-mode hicache: the L2 host tier per instance (default: the profile's); "
        "paper mode has none",
    )
    p.add_argument("--seed", type=int, default=0, help="seeds tie-breaks and random policies")
    p.add_argument(
        "--overload",
        type=float,
        default=d.overload,
        help="smetric: a sticky target above OVERLOAD x the mean load is overloaded (inf = off)",
    )
    p.add_argument(
        "--overload-slack",
        type=float,
        default=d.overload_slack,
        help="smetric: ... and also more than this many requests above the mean",
    )
    p.add_argument(
        "--hit-ratio",
        type=float,
        default=d.hit_ratio,
        help="smetric: a follow-up whose best hit is below HIT_RATIO x its history is balanced",
    )
    p.add_argument(
        "--bailian-lambda",
        type=float,
        default=d.bailian_lambda,
        help="bailian: weight of the cache-miss term against the normalised load term",
    )
    # PD mode (sim/pd.py)
    p.add_argument(
        "--pd", action="store_true", help="PD disaggregation: simulate the prefill instances only"
    )
    p.add_argument(
        "--prefill-overload-slack",
        type=float,
        default=PREFILL_OVERLOAD_SLACK,
        help="--pd: SMetric's overload slack in unprefilled tokens (replaces --overload-slack)",
    )
    p.add_argument(
        "--slo-ttft-base-s", type=float, default=slo.ttft_base_s, help="TTFT SLO: this ..."
    )
    p.add_argument(
        "--slo-ttft-per-token-ms",
        type=float,
        default=slo.ttft_per_token_ms,
        help="... plus this per input token",
    )
    p.add_argument("--slo-tpot-ms", type=float, default=slo.tpot_ms, help="TPOT SLO")
    p.add_argument("--window-s", type=float, default=30.0, help="window of imbalance_mean, seconds")
    p.add_argument(
        "--session-hints",
        action="store_true",
        help="requests carry their trace session id as a coding agent's session header would "
        "(the router's policies read it as a hint: session-hint-fallback)",
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
    """pd: cfg.params should already carry the token slack (sim.pd.pd_params). sample_seed: each
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
        params = PolicyParams(
            overload=args.overload,
            overload_slack=args.overload_slack,
            hit_ratio=args.hit_ratio,
            bailian_lambda=args.bailian_lambda,
        )
        for name in policies:
            if make_policy(name, params).uses_text_tree and args.pd:
                raise ValueError(f"policy {name!r} (text tree) is not modelled under --pd")
        cfg = SimConfig(
            instances=args.instances,
            profile=args.profile,
            gpu_kv_tokens=args.gpu_kv_tokens,
            host_kv_tokens=args.host_kv_tokens,
            params=params,
            slo=Slo(args.slo_ttft_base_s, args.slo_ttft_per_token_ms, args.slo_tpot_ms),
            window_s=args.window_s,
            session_hints=args.session_hints,
            seed=args.seed,
            tier_mode=args.tier_mode,
            gpus_per_server=args.gpus_per_server,
            nics_per_server=args.nics_per_server,
            nic_bytes_per_s=args.nic_gbytes_per_s * 1e9,
            network_fraction=args.network_fraction,
            fetch_overhead_s=args.fetch_overhead_ms * 1e-3,
            prefetch_policy=args.prefetch_policy,
        )
        if args.pd:
            cfg = pd_params(cfg, args.prefill_overload_slack)
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
