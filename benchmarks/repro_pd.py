"""Reproduce the paper's PD-disaggregation figures (21-23) with the simulator's PD mode.

    python benchmarks/repro_pd.py --out benchmarks/results --jobs 2

Workload: generated agentic traces (`smetric_router.traces.generate` with its defaults, one per
trace seed of --seeds, default 1, 2, 3), --sessions root sessions starting in a window of
--durations seconds, after the generator's 2 h warm-up). The request rate is swept by the
session start window (--durations; same sessions, same intra-session timing, only the session
starts are packed tighter), not by compressing the whole trace in time, so an agent's next turn
never arrives before its previous turn could have finished. Only requests arriving inside the
start window are replayed (the hour-later resumes and the ramp-down after it would otherwise
dominate the span of the TPS denominator).

Cluster: --instances prefill instances of the H20 Qwen3-30B-A3B profile (32, the paper's), in
the simulator's paper tier mode by default (GPU tier only + a global tier of ratio x the
cluster's GPU KV behind one 21.75 GB/s NIC per 8-GPU server; --tier-mode hicache for SGLang's).

Headline numbers (the best prefill TPS within SLO over the rate sweep, and SMetric / the best
baseline) are the mean over the seeds with the min–max; the rate sweep and TTFT plots show the
first seed.

Writes fig21_23_pd.json (every row, sim JSON schema with the PD fields and the trace seed), four
PNGs and fig21_23_pd.md (the command, the setting and the tables) into --out.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from smetric_router.engine.timing import TimingModel
from smetric_router.policies.base import make_policy
from smetric_router.sim.config import SimConfig
from smetric_router.sim.pd import PdCluster, summarize_pd, trace_pages
from smetric_router.sim.report import document, spread
from smetric_router.traces.generate import GenConfig, generate
from smetric_router.traces.loaders import load_trace
from smetric_router.traces.schema import TraceRequest

POLICIES = ("smetric", "bailian", "lmetric", "lmetric-inflight", "load_balance")
# 32 prefill instances (the paper's). The generator's default window for 200 sessions is ~416 s
# (43 requests/min/instance at 32: rate 1); the same sessions in a longer window arrive slower.
# 0.3-0.75x the trace's rate: every policy is past its knee at 1x on this model (fig21_23_pd.md).
SESSIONS = 200
TRACE_RATE_S = 416.0
DURATIONS = (1387.0, 925.0, 693.0, 555.0)
RATIOS = (0.0, math.inf)
# --free-fetches: per server, so that no transfer ever waits for the link (the colocated
# headroom figure's bound, benchmarks/repro_colocated.py)
FREE_BYTES_PER_S = 1e15
FREE_NOTE = ", its fetches free (no link, no per-fetch overhead, no PCIe time)"
SEEDS = (1, 2, 3)


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",")]


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def window_trace(path: Path, duration: float) -> list[TraceRequest]:
    trace = load_trace(path, "auto", 16)
    t0 = min(r.arrival_s for r in trace)
    return [r for r in trace if r.arrival_s - t0 <= duration]


# (seed, duration) -> (trace, its pages)
_TRACES: dict[tuple[int, float], tuple[list[TraceRequest], Any]] = {}


def _one(task: tuple[argparse.Namespace, int, float, float, str]) -> tuple[dict[str, Any], Any]:
    """One run: its row, and its TTFT samples where Figure 23 reads them (else None)."""
    args, seed, duration, ratio, name = task
    cfg = _config(args)
    trace, pages = _TRACES[seed, duration]
    base = args.base_s or max(args.durations)
    rate = base / duration
    t = time.perf_counter()
    policy = make_policy(name, cfg.params)
    res = PdCluster(cfg, policy, ratio, _timing(args, cfg)).run(trace, 1.0, None, pages)
    row = summarize_pd(res, cfg.slo, name, rate, ratio)
    row["requests"] = len(trace)
    row["seed"] = seed
    row["wall_s"] = time.perf_counter() - t
    print(
        f"seed {seed} rate {rate:.2f} global {ratio:g} {name:12s} "
        f"prefill TPS@SLO {row['prefill_tps_within_slo']:8.0f} "
        f"TTFT p50 {row['ttft_p50']:6.2f} ({row['wall_s']:.1f} s)",
        file=sys.stderr,
        flush=True,
    )
    latency = seed == args.seeds[0] and math.isinf(ratio) and duration == _latency_duration(args)
    return row, [r.first_token - r.arrival for r in res.records] if latency else None


def _config(args: argparse.Namespace) -> SimConfig:
    cfg = SimConfig(instances=args.instances, tier_mode=args.tier_mode)
    if args.free_fetches:  # no link queue, no per-fetch overhead (and no PCIe copy: _timing)
        return replace(cfg, nic_bytes_per_s=FREE_BYTES_PER_S, fetch_overhead_s=0.0)
    return cfg


def _timing(args: argparse.Namespace, cfg: SimConfig) -> TimingModel:
    timing = TimingModel.load(cfg.profile)
    if args.free_fetches:
        timing.pcie_bytes_per_s = math.inf
    return timing


def _latency_duration(args: argparse.Namespace) -> float:
    return float(sorted(args.durations)[len(args.durations) // 2])


def sweep(args: argparse.Namespace, work: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every run, one trace seed at a time: a seed's four traces with their pages take ~2.5 GB
    and forked workers copy what they touch, so holding every seed's at once ran out of memory
    on a 24 GB machine."""
    cfg = _config(args)
    rows: list[dict[str, Any]] = []
    ttfts: dict[str, Any] = {}
    for seed in args.seeds:
        _TRACES.clear()
        for duration in args.durations:
            path = work / f"agentic-{args.sessions}-{seed}-{duration:g}s.jsonl"
            generate(GenConfig(sessions=args.sessions, seed=seed, duration_s=duration), path)
            trace = window_trace(path, duration)
            _TRACES[seed, duration] = (trace, trace_pages(trace, cfg.page_size))
        tasks = [
            (args, seed, d, g, p)
            for d in sorted(args.durations, reverse=True)
            for g in args.global_ratios
            for p in args.policies
        ]
        if args.jobs > 1:  # forked workers inherit the traces; a worker that dies fails the run
            ctx = multiprocessing.get_context("fork")
            with ProcessPoolExecutor(args.jobs, mp_context=ctx) as pool:
                done = list(pool.map(_one, tasks))
        else:
            done = [_one(t) for t in tasks]
        rows += [row for row, _ in done]
        ttfts.update({t[4]: s for t, (_, s) in zip(tasks, done, strict=True) if s is not None})
    _TRACES.clear()
    return rows, ttfts


def _seeds(rows: Sequence[dict[str, Any]]) -> list[int]:
    return list(dict.fromkeys(r["seed"] for r in rows))


def _best(rows: Sequence[dict[str, Any]], policy: str, ratio: float, seed: int) -> dict[str, Any]:
    """The policy's row with the max prefill TPS within SLO over the seed's rate sweep."""
    mine = [
        r
        for r in rows
        if r["policy"] == policy and r["global_ratio"] == ratio and r["seed"] == seed
    ]
    return max(mine, key=lambda r: r["prefill_tps_within_slo"])


def headline(
    rows: Sequence[dict[str, Any]], policies: Sequence[str], ratio: float
) -> tuple[dict[str, list[float]], list[float]]:
    """Per policy its best prefill TPS within SLO on each seed, and SMetric / the best
    baseline on each seed."""
    seeds = _seeds(rows)
    best = {
        p: [_best(rows, p, ratio, s)["prefill_tps_within_slo"] for s in seeds] for p in policies
    }
    ratios = []
    baselines = [p for p in policies if p != "smetric"]
    if "smetric" not in best or not baselines:
        return best, [math.nan] * len(seeds)  # nothing to compare (one policy run alone)
    for k in range(len(seeds)):
        others = max(best[p][k] for p in baselines)
        ratios.append(best["smetric"][k] / others if others > 0 else math.nan)
    return best, ratios


def tables(rows: Sequence[dict[str, Any]], policies: Sequence[str]) -> str:
    ratios = list(dict.fromkeys(r["global_ratio"] for r in rows))
    seeds = _seeds(rows)
    out = [
        "### Max prefill TPS within SLO over the rate sweep (Figure 22a)",
        "",
        f"Trace seeds {', '.join(map(str, seeds))}: mean [min–max] over the seeds, each seed's "
        "best rate.",
        "",
    ]
    out.append("| global/local | " + " | ".join(policies) + " | SMetric / best baseline |")
    out.append("|---" * (len(policies) + 2) + "|")
    for g in ratios:
        best, gain = headline(rows, policies, g)
        cells = " | ".join(spread(best[p]).fmt(",.0f") for p in policies)
        out.append(f"| {g:g} | {cells} | {spread(gain).fmt('.3f')} |")
    out += ["", "### Every run (prefill TPS in prompt tokens/s, TTFT in s)", ""]
    out.append(
        "| seed | global | rate | policy | prefill TPS | within SLO | TTFT p50/p90/p99 | reuse "
        "| local | global hit | imbalance | sticky | wall s |"
    )
    out.append("|---" * 13 + "|")
    for r in rows:
        out.append(
            f"| {r['seed']} | {r['global_ratio']:g} | {r['rate_scale']:.2f} | {r['policy']} | "
            f"{r['prefill_tps']:,.0f} | {r['prefill_tps_within_slo']:,.0f} | "
            f"{r['ttft_p50']:.2f}/{r['ttft_p90']:.2f}/{r['ttft_p99']:.2f} | "
            f"{r['reuse_ratio']:.1%} | {r['local_hit_ratio']:.1%} | {r['global_hit_ratio']:.1%} | "
            f"{r['imbalance_mean']:.2f} | {r['followup_stickiness']:.1%} | {r['wall_s']:.0f} |"
        )
    return "\n".join(out)


def plots(rows: Sequence[dict[str, Any]], ttfts: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = list(dict.fromkeys(r["policy"] for r in rows))
    ratios = list(dict.fromkeys(r["global_ratio"] for r in rows))
    first = _seeds(rows)[0]
    written = []

    fig, ax = plt.subplots(figsize=(6, 4))
    for p in policies:
        pts = sorted(
            (r["rate_scale"], r["prefill_tps_within_slo"])
            for r in rows
            if r["policy"] == p and math.isinf(r["global_ratio"]) and r["seed"] == first
        )
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=p)
    ax.set(xlabel="request rate (x the trace's)", ylabel="prefill TPS within SLO (tokens/s)")
    ax.set_title(f"Fig. 21a: rate sweep, fully provisioned global tier (seed {first})")
    ax.legend()
    written.append(_save(fig, out / "fig21a_pd_rate_sweep.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(policies)
    spreads = {g: headline(rows, policies, g)[0] for g in ratios}
    for k, p in enumerate(policies):
        cells = [spread(spreads[g][p]) for g in ratios]
        ys = [c.mean for c in cells]
        err = [[c.mean - c.lo for c in cells], [c.hi - c.mean for c in cells]]
        ax.bar(np.arange(len(ratios)) + k * width, ys, width, yerr=err, capsize=2, label=p)
    ax.set_xticks(np.arange(len(ratios)) + 0.4 - width / 2, [f"{g:g}" for g in ratios])
    ax.set(xlabel="global / local capacity", ylabel="max prefill TPS within SLO (tokens/s)")
    ax.set_title("Fig. 22a: global-tier provisioning (mean, min–max over seeds)")
    ax.legend()
    written.append(_save(fig, out / "fig22a_pd_global_tier.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    labels, local, glob = [], [], []
    for g in ratios:
        for p in policies:
            r = _best(rows, p, g, first)
            labels.append(f"{p}\ng{g:g}")
            local.append(r["local_hit_ratio"])
            glob.append(r["global_hit_ratio"])
    ax.bar(labels, local, label="local tier")
    ax.bar(labels, glob, bottom=local, label="global tier")
    ax.tick_params(axis="x", labelsize=6)
    ax.set(ylabel="share of prompt tokens reused")
    ax.set_title(f"Fig. 22b: reuse split (at each policy's best rate, seed {first})")
    ax.legend()
    written.append(_save(fig, out / "fig22b_pd_reuse.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for p, samples in ttfts.items():
        xs = np.sort([s for s in samples if s >= 0])
        ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=p)
    ax.set(xscale="log", xlabel="TTFT (s)", ylabel="CDF")
    ax.set_title(f"Fig. 23: TTFT, fully provisioned global tier (seed {first})")
    ax.legend()
    written.append(_save(fig, out / "fig23_pd_ttft_cdf.png"))
    return written


def _document(
    args: argparse.Namespace, argv: Sequence[str] | None, doc: dict[str, Any], text: str
) -> str:
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    given = " ".join(sys.argv[1:] if argv is None else argv)
    n = sorted({r["requests"] for r in doc["results"]})
    base = args.base_s or max(args.durations)
    return "\n".join(
        [
            "# Figures 21–23: SMetric under PD disaggregation (simulator, prefill instances only)",
            "",
            f"Command: `python benchmarks/repro_pd.py {given}` at commit {head} (wall "
            f"{doc['wall_s'] / 60:.1f} min, CPU {doc['cpu_s'] / 60:.1f} min in the parent; "
            "simulated, not measured).",
            "",
            f"Setting: {args.instances} prefill instances (h20-qwen3-coder-30b-a3b), tier mode "
            f"`{args.tier_mode}`; traces `python -m smetric_router.traces generate --sessions "
            f"{args.sessions} --seed S --duration-s D` for S in "
            f"{', '.join(map(str, args.seeds))} and D in "
            f"{', '.join(f'{d:g}' for d in args.durations)} s, each replayed over its start "
            f"window ({n[0]:,}–{n[-1]:,} requests); rate = {base:g} s / D (x the "
            "trace's own rate). Global tier: "
            f"{', '.join(f'{g:g}' for g in args.global_ratios)} x the cluster's GPU KV"
            + (FREE_NOTE if args.free_fetches else "")
            + ". Prefill "
            "TPS counts prompt tokens whose KV is produced (computed or reused) per second; "
            "the SLO is the TTFT part of the simulator's.",
            "",
            text,
            "",
            "![21a](fig21a_pd_rate_sweep.png) ![22a](fig22a_pd_global_tier.png) "
            "![22b](fig22b_pd_reuse.png) ![23](fig23_pd_ttft_cdf.png)",
            "",
        ]
    )


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="output folder")
    p.add_argument("--sessions", type=int, default=SESSIONS, help="root sessions per trace")
    p.add_argument(
        "--seeds",
        type=_ints,
        default=list(SEEDS),
        help="trace seeds, comma-separated: headline numbers are mean [min-max] over them",
    )
    p.add_argument("--seed", type=int, help="one trace seed (the same as --seeds N)")
    p.add_argument("--instances", type=int, default=32, help="prefill instances (paper: 32)")
    p.add_argument(
        "--durations",
        type=_floats,
        default=list(DURATIONS),
        help="session start windows in s, one trace each; shorter = a higher request rate",
    )
    p.add_argument(
        "--base-s",
        type=float,
        default=TRACE_RATE_S,
        help="duration of rate 1 (the generator's window for --sessions 200: the trace's rate)",
    )
    p.add_argument(
        "--global-ratios",
        type=_floats,
        default=list(RATIOS),
        help="global-tier capacity, x the cluster's GPU KV (inf: never binds, 0: none)",
    )
    p.add_argument(
        "--tier-mode",
        choices=("paper", "hicache"),
        default="paper",
        help="the simulator's tier mode (SimConfig.tier_mode)",
    )
    p.add_argument(
        "--free-fetches",
        action="store_true",
        help="every global-tier fetch free (no link, no per-fetch overhead, no PCIe time): what "
        "keeping histories local could still add, the colocated headroom figure's bound",
    )
    p.add_argument("--jobs", type=int, default=1, help="simulator runs in parallel processes")
    p.add_argument("--policies", type=lambda s: s.split(","), default=list(POLICIES))
    args = p.parse_args(argv)
    if args.seed is not None:
        args.seeds = [args.seed]
    if "smetric" not in args.policies:
        p.error("--policies must include smetric")
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    cpu = time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        rows, ttfts = sweep(args, Path(tmp))
    doc = document(rows)
    doc["setup"] = {k: v for k, v in vars(args).items() if k != "out"}
    doc["setup"]["global_ratios"] = [str(g) if math.isinf(g) else g for g in args.global_ratios]
    doc["wall_s"] = time.perf_counter() - started
    doc["cpu_s"] = time.process_time() - cpu
    (args.out / "fig21_23_pd.json").write_bytes(
        orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY, default=str)
    )
    text = tables(rows, args.policies)
    print(text)
    (args.out / "fig21_23_pd.md").write_text(_document(args, argv, doc, text))
    for path in plots(rows, ttfts, args.out):
        print(f"wrote {path}", file=sys.stderr)
    print(f"\nwall {doc['wall_s']:.0f} s, CPU {doc['cpu_s']:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
