"""Reproduce the paper's PD-disaggregation figures (21-23) with the simulator's PD mode.

    python benchmarks/repro_pd.py --out benchmarks/results   # ~12 min CPU, one core

Workload: a generated agentic trace (`smetric_router.traces.generate`, seed 0, 1,500 root
sessions). The request rate is swept by the session start window (--durations; same sessions,
same intra-session timing, only the session starts are packed tighter), not by compressing the
whole trace in time, so an agent's next turn never arrives before its previous turn could have
finished. Only requests arriving inside the start window are replayed (the hour-later resumes
and the ramp-down after it would otherwise dominate the span of the TPS denominator).

Cluster: --instances prefill instances of the H20 Qwen3-30B-A3B profile (8 = one server; the
paper runs 32: the CPU budget of this study does not stretch to 32 at a load near the knee).

Writes fig21_23_pd.json (every row, sim JSON schema with the PD fields) and four PNGs into --out,
and prints the markdown tables that benchmarks/results/fig21_23_pd.md quotes.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from smetric_router.policies.base import make_policy
from smetric_router.sim.config import SimConfig
from smetric_router.sim.pd import PdCluster, pd_params, summarize_pd, trace_pages
from smetric_router.sim.report import document
from smetric_router.traces.generate import GenConfig, generate
from smetric_router.traces.loaders import load_trace
from smetric_router.traces.schema import TraceRequest

POLICIES = ("smetric", "bailian", "lmetric", "load_balance")


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",")]


def window_trace(path: Path, duration: float) -> list[TraceRequest]:
    trace = load_trace(path, "auto", 16)
    t0 = min(r.arrival_s for r in trace)
    return [r for r in trace if r.arrival_s - t0 <= duration]


def sweep(args: argparse.Namespace, work: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    cfg = pd_params(SimConfig(instances=args.instances))
    base = args.base_s or max(args.durations)
    rows: list[dict[str, Any]] = []
    ttfts: dict[str, Any] = {}  # policy -> TTFT samples of the latency run (Figure 23)
    latency_rate = base / sorted(args.durations)[len(args.durations) // 2]
    for duration in sorted(args.durations, reverse=True):
        path = work / f"agentic-{args.sessions}-{duration:g}s.jsonl"
        generate(GenConfig(sessions=args.sessions, seed=args.seed, duration_s=duration), path)
        trace = window_trace(path, duration)
        pages = trace_pages(trace, cfg.page_size)
        rate = base / duration
        for ratio in args.global_ratios:
            for name in args.policies:
                t = time.perf_counter()
                res = PdCluster(cfg, make_policy(name, cfg.params), ratio).run(
                    trace, 1.0, None, pages
                )
                row = summarize_pd(res, cfg.slo, name, rate, ratio)
                row["requests"] = len(trace)
                row["wall_s"] = time.perf_counter() - t
                rows.append(row)
                if math.isinf(ratio) and rate == latency_rate:
                    ttfts[name] = [r.first_token - r.arrival for r in res.records]
                print(
                    f"rate {rate:.2f} global {ratio:g} {name:12s} "
                    f"prefill TPS@SLO {row['prefill_tps_within_slo']:8.0f} "
                    f"TTFT p50 {row['ttft_p50']:6.2f} ({row['wall_s']:.1f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    return rows, ttfts


def _best(rows: Sequence[dict[str, Any]], policy: str, ratio: float) -> dict[str, Any]:
    mine = [r for r in rows if r["policy"] == policy and r["global_ratio"] == ratio]
    return max(mine, key=lambda r: r["prefill_tps_within_slo"])


def tables(rows: Sequence[dict[str, Any]], policies: Sequence[str]) -> str:
    ratios = list(dict.fromkeys(r["global_ratio"] for r in rows))
    out = ["### Max prefill TPS within SLO over the rate sweep (Figure 22a)", ""]
    out.append("| global/local | " + " | ".join(policies) + " | SMetric vs best baseline |")
    out.append("|---" * (len(policies) + 2) + "|")
    for g in ratios:
        best = {p: _best(rows, p, g)["prefill_tps_within_slo"] for p in policies}
        others = max(v for p, v in best.items() if p != "smetric")
        gain = best["smetric"] / others - 1 if others > 0 else math.nan
        cells = " | ".join(f"{best[p]:,.0f}" for p in policies)
        out.append(f"| {g:g} | {cells} | {gain:+.1%} |")
    out += ["", "### Every run (prefill TPS in prompt tokens/s, TTFT in s)", ""]
    out.append(
        "| global | rate | policy | prefill TPS | within SLO | TTFT p50/p90/p99 | reuse | local "
        "| global hit | imbalance | sticky | wall s |"
    )
    out.append("|---" * 12 + "|")
    for r in rows:
        out.append(
            f"| {r['global_ratio']:g} | {r['rate_scale']:.2f} | {r['policy']} | "
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
    written = []

    fig, ax = plt.subplots(figsize=(6, 4))
    for p in policies:
        pts = sorted(
            (r["rate_scale"], r["prefill_tps_within_slo"])
            for r in rows
            if r["policy"] == p and math.isinf(r["global_ratio"])
        )
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=p)
    ax.set(xlabel="request rate (x lowest)", ylabel="prefill TPS within SLO (tokens/s)")
    ax.set_title("Fig. 21a: rate sweep, fully provisioned global tier")
    ax.legend()
    written.append(_save(fig, out / "fig21a_pd_rate_sweep.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(policies)
    for k, p in enumerate(policies):
        ys = [_best(rows, p, g)["prefill_tps_within_slo"] for g in ratios]
        ax.bar(np.arange(len(ratios)) + k * width, ys, width, label=p)
    ax.set_xticks(np.arange(len(ratios)) + 0.4 - width / 2, [f"{g:g}" for g in ratios])
    ax.set(xlabel="global / local capacity", ylabel="max prefill TPS within SLO (tokens/s)")
    ax.set_title("Fig. 22a: global-tier provisioning")
    ax.legend()
    written.append(_save(fig, out / "fig22a_pd_global_tier.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    labels, local, glob = [], [], []
    for g in ratios:
        for p in policies:
            r = _best(rows, p, g)
            labels.append(f"{p}\ng{g:g}")
            local.append(r["local_hit_ratio"])
            glob.append(r["global_hit_ratio"])
    ax.bar(labels, local, label="local tier")
    ax.bar(labels, glob, bottom=local, label="global tier")
    ax.tick_params(axis="x", labelsize=6)
    ax.set(ylabel="share of prompt tokens reused")
    ax.set_title("Fig. 22b: reuse split (at each policy's best rate)")
    ax.legend()
    written.append(_save(fig, out / "fig22b_pd_reuse.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for p, samples in ttfts.items():
        xs = np.sort([s for s in samples if s >= 0])
        ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=p)
    ax.set(xscale="log", xlabel="TTFT (s)", ylabel="CDF")
    ax.set_title("Fig. 23: TTFT, fully provisioned global tier")
    ax.legend()
    written.append(_save(fig, out / "fig23_pd_ttft_cdf.png"))
    return written


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--sessions", type=int, default=1500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--instances", type=int, default=8)
    p.add_argument("--durations", type=_floats, default=[800.0, 600.0, 480.0, 400.0, 340.0])
    p.add_argument(
        "--base-s", type=float, default=None, help="duration of rate 1 (default: the longest)"
    )
    p.add_argument("--global-ratios", type=_floats, default=[0.0, 0.5, 1.6, math.inf])
    p.add_argument("--policies", type=lambda s: s.split(","), default=list(POLICIES))
    args = p.parse_args(argv)
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
    print(tables(rows, args.policies))
    for path in plots(rows, ttfts, args.out):
        print(f"wrote {path}", file=sys.stderr)
    print(f"\nwall {doc['wall_s']:.0f} s, CPU {doc['cpu_s']:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
