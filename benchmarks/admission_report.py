"""The admission benchmark's report: benchmarks/results/admission.md and its three plots."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.admission_flood import FloodResult
from benchmarks.admission_stats import RunStats

ON, OFF, SMG = "smetric+admission", "smetric", "smg+queue"


@dataclass(frozen=True, slots=True)
class Context:
    """What the report states about how the numbers were made."""

    command: str
    elapsed_s: float
    cluster: str
    capacity_sessions_s: float  # wall
    capacity_req_s: float  # wall
    mean_request_s: float  # wall, at calibration
    capacity_line: str
    settings: dict[str, str]  # contender -> its admission flags
    workload: str
    slo_ttft_s: float  # model
    speedup: float
    tenants: tuple[str, ...]
    burst_tenant: str
    quick: bool


def _f(x: float, nd: int = 2) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def _at(runs: Sequence[RunStats], router: str, load: float) -> RunStats | None:
    return next((r for r in runs if r.router == router and r.load == load), None)


def targets(runs: Sequence[RunStats], iso: Sequence[RunStats], fl: FloodResult | None,
            speedup: float) -> list[tuple[str, str, str]]:  # fmt: skip
    """(target, measured, verdict) rows; 'not run' where the run lacked the point."""
    out: list[tuple[str, str, str]] = []

    def row(name: str, value: float | None, ok: bool | None, fmt: str = "{:.2f}") -> None:
        shown = "n/a" if value is None or math.isnan(value) else fmt.format(value)
        out.append((name, shown, "not run" if ok is None else "met" if ok else "missed"))

    on, off = _at(runs, ON, 2.0), _at(runs, OFF, 2.0)
    if on and off:
        g = _ratio(on.goodput, off.goodput)
        row("2×: goodput ≥ 1.2× no admission", g, g >= 1.2, "{:.2f}×")
        c = _ratio(on.completed, off.completed)
        row("2×: sessions completed ≥ 1.3× no admission", c, c >= 1.3, "{:.2f}×")
    else:
        row("2× points (goodput, sessions)", None, None)
    if on:
        f = _ratio(on.follow_ttft_p90_s, on.first_ttft_p90_s)
        row("2×: follow-up TTFT p90 ≤ 0.5× first-turn p90", f, f <= 0.5, "{:.2f}×")
        row("2×: no admitted request lost", on.lost, on.lost == 0, "{:.0f} lost")
        ra = on.shed_429_with_retry_after
        row("2×: every shed request a 429 with Retry-After", on.shed - ra,
            on.shed > 0 and ra == on.shed, "{:.0f} not, of " + str(on.shed))  # fmt: skip
    alone = next((r for r in iso if r.router == ON and r.load == 0.0), None)
    burst = next((r for r in iso if r.router == ON and r.load > 0), None)
    if alone and burst:
        victim = min(alone.tenants)
        share = _ratio(burst.tenants.get(victim, {}).get("goodput", 0.0),
                       alone.tenants[victim]["goodput"])  # fmt: skip
        row(f"isolation: {victim}'s goodput with the burst ≥ 0.8× alone", share, share >= 0.8)
    else:
        row("isolation", None, None)
    below = False  # a point at or below capacity, run with admission on and off
    for x in sorted({r.load for r in runs if 0 < r.load <= 1.0}):
        on1, off1, at = _at(runs, ON, x), _at(runs, OFF, x), f"{x:g}×"
        if on1 is None or off1 is None:
            continue
        below = True
        cost = 1 - _ratio(on1.goodput, off1.goodput)
        row(f"{at}: admission costs < 2 % goodput", 100 * cost, cost < 0.02, "{:.1f} %")
        # in wall ms: the router's own cost does not run at the model's speed
        added = (on1.ttft_p50_s - off1.ttft_p50_s) / speedup * 1000
        row(f"{at}: admission adds < 0.2 ms TTFT p50 (wall ms; two runs' difference, which "
            "run-to-run noise can exceed: benchmarks/router_overhead.py isolates a router's own "
            "cost)", added,
            added < 0.2, "{:+.2f} ms")  # fmt: skip
    if not below:
        row("at or below capacity (≤ 1×) points", None, None)
    if fl is not None:
        grew = fl.rss_after_mb[-1] - fl.rss_before_mb
        ok = fl.served_after and fl.queued_after == 0 and fl.running_after == 0 and fl.bounded
        row(f"flood ({len(fl.rss_after_mb)} × {fl.requests} waiting, clients leaving): RSS "
            "bounded, still serving", grew, ok, "{:+.1f} MiB in all")  # fmt: skip
    else:
        row("flood", None, None)
    return out


def write(runs: Sequence[RunStats], iso: Sequence[RunStats], fl: FloodResult | None,
          ctx: Context, out_md: Path) -> None:  # fmt: skip
    stem = out_md.stem
    unit = "model s"
    lines = [
        f"# Admission control under overload ({stem})",
        "",
        "Modelled time on emulated H20 workers (Qwen3-Coder-30B-A3B timing profile): every "
        f"duration below is wall time × the workers' speedup ({ctx.speedup:g}), i.e. what the "
        "modelled GPU would take; the router's and client's own costs are wall time on this "
        "shared 2-core machine scaled the same way. **One run per point.**"
        + (
            " This is the `--quick` smoke size: too short to read as a result." if ctx.quick else ""
        ),
        "",
        f"Command: `{ctx.command}` ({ctx.elapsed_s / 60:.1f} min wall).",
        "",
        f"- Cluster: {ctx.cluster}.",
        f"- Capacity: {ctx.capacity_line}",
        f"- Workload: {ctx.workload}",
        f"- SLO: TTFT ≤ {ctx.slo_ttft_s * 1000:g} ms model time, counted from a turn's first "
        "attempt (a 429's Retry-After pause and the retry included). Goodput: requests answered "
        "in SLO per model second of the run (arrivals, then a drain; what still runs at the end "
        "is cut and counted unfinished). Queue wait: smetric-router's "
        "`x-smetric-admission-wait-ms` on admitted requests.",
        "- Routers, all in front of the same workers, caches flushed before each run:",
        *(f"  - `{k}`: {v}" for k, v in ctx.settings.items()),
        "",
        "## Load sweep",
        "",
        "| router | load | goodput (req/s) | in SLO | sessions completed / started | abandoned | "
        "failed | session time p50 / p90 (s) | first-turn TTFT p50 / p90 (s) | follow-up TTFT "
        "p50 / p90 (s) | refused (429 with Retry-After) | refusals: status reason | lost | "
        "queue wait p50 (wall ms) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(r.shed_reasons.items())) or "-"
        lines.append(
            f"| {r.router} | {r.load:g}× | {_f(r.goodput)} | {r.in_slo} / {r.ok} | "
            f"{r.completed} / {r.sessions} | {r.abandoned} | {r.failed} | "
            f"{_f(r.session_p50_s)} / {_f(r.session_p90_s)} | {_f(r.first_ttft_p50_s, 3)} / "
            f"{_f(r.first_ttft_p90_s, 3)} | {_f(r.follow_ttft_p50_s, 3)} / "
            f"{_f(r.follow_ttft_p90_s, 3)} | {r.shed} ({r.shed_429_with_retry_after}) | "
            f"{reasons} | {r.lost} | {_f(r.wait_ms_p50, 1)} |"
        )
    lines += ["", "Per-tenant share of the requests answered in SLO (goodput req/s, share):", "",
              "| router | load | " + " | ".join(ctx.tenants) + " |",
              "|---|---|" + "---|" * len(ctx.tenants)]  # fmt: skip
    for r in runs:
        cells = [f"{_f(r.tenants.get(t, {}).get('goodput', 0.0))} "
                 f"({100 * r.tenants.get(t, {}).get('share', 0.0):.0f} %)"
                 for t in ctx.tenants]  # fmt: skip
        lines.append(f"| {r.router} | {r.load:g}× | " + " | ".join(cells) + " |")
    if iso:
        lines += ["", "## Isolation", "",
                  f"One tenant at its share (1/{len(ctx.tenants)} of capacity) alone, then with "
                  f"`{ctx.burst_tenant}` bursting sub-agents at 10× its share.", "",
                  "| router | run | tenant | goodput (req/s) | sessions completed / started | "
                  "first-turn TTFT p90 (s) | refused |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in iso:
            run = "alone" if r.load == 0 else "with the burst"
            for t, v in sorted(r.tenants.items()):
                lines.append(f"| {r.router} | {run} | {t} | {_f(v['goodput'])} | "
                             f"{v['completed']:.0f} / {v['sessions']:.0f} | "
                             f"{_f(v['first_ttft_p90_s'], 3)} | {v['shed']:.0f} |")  # fmt: skip
    if fl is not None:
        after = "200" if fl.served_after else "not 200"
        lines += ["", "## Flood", "",
                  f"{len(fl.rss_after_mb)} rounds of {fl.requests} streamed requests at once into "
                  "smetric-router with admission on (queue large enough to hold them all); once "
                  "95 % of them wait in the queue (or a minute has passed) each client leaves "
                  "within the hold time unless answered first. "
                  "Bounded: the last round grew RSS by under a tenth of what the first did (or "
                  "5 MiB): a flood's memory is reused by the next, not added to.", "",
                  f"- outcomes: {fl.outcomes}; {fl.seconds:.1f} s wall",
                  f"- router RSS: {fl.rss_before_mb:.1f} MiB before, {fl.rss_peak_mb:.1f} MiB at "
                  "the peak, after each round: "
                  + ", ".join(f"{x:.1f} MiB" for x in fl.rss_after_mb),
                  f"- `smetric_admission_queued`: peak {fl.queued_peak:.0f}, after "
                  f"{fl.queued_after:.0f}; `smetric_admission_running` after "
                  f"{fl.running_after:.0f}",
                  "- a request after the flood: " + after]  # fmt: skip
    lines += ["", "## Targets", "", "| target | measured | verdict |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in targets(runs, iso, fl, ctx.speedup)]
    lines += ["", f"![goodput vs load]({stem}_goodput.png)",
              f"![TTFT follow-up vs first turn]({stem}_ttft.png)",
              f"![per-tenant share]({stem}_tenants.png)", ""]  # fmt: skip
    out_md.write_text("\n".join(lines))
    _plots(runs, ctx, out_md, unit)


def _plots(runs: Sequence[RunStats], ctx: Context, out_md: Path, unit: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stem = out_md.stem
    routers = list(dict.fromkeys(r.router for r in runs))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in routers:
        rs = sorted((r for r in runs if r.router == name), key=lambda r: r.load)
        ax.plot([r.load for r in rs], [r.goodput for r in rs], marker="o", label=name)
    ax.set_xlabel("offered load (× capacity)")
    ax.set_ylabel(f"goodput (requests in SLO per {unit})")
    ax.set_title(
        f"goodput vs load (TTFT ≤ {ctx.slo_ttft_s * 1000:g} ms; emulated H20, one run each)"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_md.with_name(f"{stem}_goodput.png"), dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, name in enumerate(routers):
        rs = sorted((r for r in runs if r.router == name), key=lambda r: r.load)
        color = f"C{i}"
        ax.plot([r.load for r in rs], [r.first_ttft_p90_s for r in rs], marker="o", color=color,
                label=f"{name}: first turn")  # fmt: skip
        ax.plot([r.load for r in rs], [r.follow_ttft_p90_s for r in rs], marker="s",
                linestyle="--", color=color, label=f"{name}: follow-up")  # fmt: skip
    ax.set_yscale("log")
    ax.set_xlabel("offered load (× capacity)")
    ax.set_ylabel(f"TTFT p90 ({unit})")
    ax.set_title("TTFT p90: follow-up vs first turn (emulated H20, one run each)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_md.with_name(f"{stem}_ttft.png"), dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    labels = [f"{r.router}\n{r.load:g}×" for r in runs]
    bottom = [0.0] * len(runs)
    for t in ctx.tenants:
        vals = [r.tenants.get(t, {}).get("goodput", 0.0) for r in runs]
        ax.bar(labels, vals, bottom=bottom, label=t)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_ylabel(f"goodput (requests in SLO per {unit})")
    ax.set_title("goodput by tenant (emulated H20, one run each)")
    ax.tick_params(axis="x", labelsize=6)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_md.with_name(f"{stem}_tenants.png"), dpi=110)
    plt.close(fig)


def dump(runs: Sequence[RunStats], iso: Sequence[RunStats], fl: FloodResult | None,
         ctx: Context) -> dict[str, Any]:  # fmt: skip
    """Everything the report shows, as JSON-ready data (kept beside the runs)."""
    return {"context": asdict(ctx), "runs": [asdict(r) for r in runs],
            "isolation": [asdict(r) for r in iso], "flood": asdict(fl) if fl else None}  # fmt: skip
