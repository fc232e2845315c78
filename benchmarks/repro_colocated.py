"""The paper's PD-colocation figures on the simulator (issue 3): Figures 9, 11/16, 12, 14/24, 15, 25
and the issue's acceptance table.

    python -m benchmarks.repro_colocated \
        {bailian_lambda,fig9,fig11,fig12,fig14,fig15,fig25,acceptance,all,reuse,moves}

One generated agentic trace (generated here if missing, see TRACE_CMD), its first LIMIT requests,
32 instances of the default H20 + Qwen3-30B-A3B profile, the simulator's default SLO (TTFT 2 s +
0.12 ms per input token, TPOT 30 ms; chosen before any policy result was looked at). Every run is
one `Cluster.run` and is cached under CACHE (keyed by all its settings), so figures sharing runs
(e.g. Fig 12 reads Fig 11's) cost nothing twice. Each figure writes benchmarks/results/figN.md and
a PNG beside it.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import orjson

from smetric_router.core.types import ClusterView, Decision, RequestFeatures
from smetric_router.policies import make_policy
from smetric_router.policies.base import PolicyParams
from smetric_router.sim.cluster import Cluster, RunResult, arrival_order
from smetric_router.sim.config import SimConfig
from smetric_router.sim.metrics import last_arrival_window, summarize, window_imbalance
from smetric_router.traces.generate import GenConfig, generate
from smetric_router.traces.loaders import load_trace
from smetric_router.traces.schema import TraceRequest

matplotlib.use("Agg")
import matplotlib.pyplot as plt

WORK = Path("/tmp/smetric-repro")
SESSIONS, SEED = 4000, 1
TRACE = WORK / f"agentic-{SESSIONS}-s{SEED}.jsonl"
TRACE_CMD = (
    f"python -m smetric_router.traces generate --sessions {SESSIONS} --seed {SEED} --out {TRACE}"
)
# The generator starts 4,000 root sessions over ~13 min, then a thin tail of late turns and
# hour-later resumes runs for 4 h; the first 8,000 requests (~9 min at rate scale 1) are the dense
# part, so TPS is not diluted by hours of an idle cluster.
LIMIT = 8000
CACHE = WORK / "cache"
RESULTS = Path(__file__).resolve().parent / "results"
POLICIES = ("smetric", "bailian", "lmetric", "load_balance")
BASE_RATE = 0.8  # rate scale "1.0x" of Fig 15: where TPS within SLO starts to bend
SWEEP = (1.0, 1.5, 1.75, 2.0)  # x BASE_RATE: Fig 15 and the max-TPS sweep, full global tier
SHORT_SWEEP = (1.0, 1.5, 2.0)  # the max-TPS sweep at finite provisioning (CPU budget)
RATIOS = (0.0, 1.6, math.inf)  # global / local capacity (Fig 11 / 16)
AT = 1.5  # x BASE_RATE: the operating point of Figs 12, 14/24, 25 (the paper's Fig 17 uses 1.5x)
WINDOW_S = 30.0


@dataclass(frozen=True, slots=True)
class Spec:
    policy: str
    rate: float  # x BASE_RATE
    ratio: float = math.inf
    overload: float = 2.0
    slack: float = 2.0
    hit_ratio: float = 0.5
    lam: float = PolicyParams().bailian_lambda

    def key(self) -> str:
        return (
            f"{TRACE.stem}-l{LIMIT}-{self.policy}-r{self.rate * BASE_RATE:g}-g{self.ratio:g}"
            f"-o{self.overload:g}-s{self.slack:g}-h{self.hit_ratio:g}"
            + (f"-lam{self.lam:g}" if self.policy == "bailian" else "")
        )


_trace: list[TraceRequest] = []


def trace() -> list[TraceRequest]:
    if not _trace:
        if not TRACE.exists():
            WORK.mkdir(parents=True, exist_ok=True)
            generate(GenConfig(sessions=SESSIONS, seed=SEED), TRACE)
        _trace.extend(load_trace(TRACE, "bailian")[:LIMIT])
    return _trace


def _extra(res: RunResult) -> dict[str, Any]:
    tpot = [
        (r.finish - r.first_token) / (r.output_len - 1) * 1e3
        for r in res.records
        if r.first_token >= 0 and r.output_len > 1
    ]
    last = last_arrival_window(res.records, WINDOW_S)
    return {
        "tpot_p95": float(np.percentile(tpot, 95)),
        "imb30": window_imbalance(res.window_tokens, last),  # windows while requests arrive
        "imbalance_with_drain": float(np.mean(window_imbalance(res.window_tokens, 1 << 30))),
        "imb60": window_imbalance(res.window_tokens, last, group=2),
        "dropped": sum(r.first_token < 0 for r in res.records),
    }


def run(spec: Spec) -> dict[str, Any]:
    path = CACHE / f"{spec.key()}.json"
    if path.exists():
        cached: dict[str, Any] = orjson.loads(path.read_bytes())
        return cached
    params = PolicyParams(
        overload=spec.overload,
        overload_slack=spec.slack,
        hit_ratio=spec.hit_ratio,
        bailian_lambda=spec.lam,
    )
    cfg = SimConfig(params=params, global_ratio=spec.ratio, window_s=WINDOW_S)
    reqs = trace()
    t = time.perf_counter()
    res = Cluster(cfg, make_policy(spec.policy, params), spec.ratio).run(
        reqs, spec.rate * BASE_RATE
    )
    wall = time.perf_counter() - t
    out = summarize(res, cfg.slo, spec.policy, spec.rate * BASE_RATE, spec.ratio)
    out.update(_extra(res), wall_s=wall)
    print(f"{spec.key()}: {wall:.0f} s, TPS@SLO {out['tps_within_slo']:.0f}", flush=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(out, option=orjson.OPT_SERIALIZE_NUMPY))
    return out


JOBS = 1  # --jobs: uncached runs of one figure go to this many processes


def runs(specs: Sequence[Spec]) -> list[dict[str, Any]]:
    todo = list(dict.fromkeys(s for s in specs if not (CACHE / f"{s.key()}.json").exists()))
    if JOBS > 1 and len(todo) > 1:
        trace()  # loaded once, inherited by the forked workers
        with multiprocessing.get_context("fork").Pool(min(JOBS, len(todo))) as pool:
            pool.map(run, todo, chunksize=1)
    return [run(s) for s in specs]


def sweep(ratio: float) -> tuple[float, ...]:
    return SWEEP if math.isinf(ratio) else SHORT_SWEEP


def best(policy: str, ratio: float) -> dict[str, Any]:
    """The policy's row with the max TPS within SLO over the rate sweep at this provisioning."""
    rows = runs([Spec(policy, r, ratio) for r in sweep(ratio)])
    return max(rows, key=lambda x: x["tps_within_slo"])


# --- output helpers --------------------------------------------------------------------------


def pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def md_table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return lines


def sim_time(rows: Sequence[dict[str, Any]]) -> str:
    return f"{len(rows)} runs, {sum(r['wall_s'] for r in rows) / 60:.1f} min of simulation"


def write(name: str, title: str, body: list[str], rows: Sequence[dict[str, Any]]) -> None:
    head = [
        f"# {title}",
        "",
        f"Command: `python -m benchmarks.repro_colocated {name}` "
        f"({sim_time(rows)} on one core of the shared 2-core machine; cached runs are reused).",
        "",
        f"Setting: trace `{TRACE_CMD}`, first {LIMIT} requests; 32 instances, profile "
        "h20-qwen3-coder-30b-a3b; SLO TTFT 2 s + 0.12 ms/input token, TPOT 30 ms (simulator "
        f"default); rate scale 1.0x = {BASE_RATE} x the trace's arrival rate.",
        "",
    ]
    (RESULTS / f"{name}.md").write_text("\n".join(head + body) + "\n")
    print(f"wrote {RESULTS / name}.md")


def save(fig: Any, name: str) -> str:
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=110)
    plt.close(fig)
    return f"![{name}]({name}.png)"


def cdf(ax: Any, values: Sequence[float], label: str) -> None:
    xs = np.sort(values)
    ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=label)


# --- figures ---------------------------------------------------------------------------------


LAMBDAS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
# The paper's Bailian imbalance over load-balance-only's: 2.7 / 2.1 (Fig 11c), 3.0 / 2.0 (Fig 15b)
PAPER_BAILIAN_OVER_LB = (2.7 / 2.1, 3.0 / 2.0)


def bailian_lambda() -> None:
    """Bailian's λ is unpublished ("a large λ to favor more KV$ hits"): take the λ whose imbalance,
    relative to load_balance's at the same point, is nearest the paper's range (a ratio: the
    model's imbalance levels are not the paper's for any policy). TPS chooses nothing."""
    tiers = (math.inf, 0.0)
    rows = runs([Spec("bailian", AT, g, lam=lam) for g in tiers for lam in LAMBDAS])
    lb = runs([Spec("load_balance", AT, g) for g in tiers])
    lo, hi = PAPER_BAILIAN_OVER_LB
    ratio = [
        r["imbalance_mean"] / lb[i // len(LAMBDAS)]["imbalance_mean"] for i, r in enumerate(rows)
    ]
    gap = [max(lo - x, x - hi, 0.0) for x in ratio[: len(LAMBDAS)]]  # full tier
    chosen = LAMBDAS[int(np.argmin(gap))]
    table = [
        (
            f"{lam:g}" + (" (chosen)" if i == LAMBDAS.index(chosen) else ""),
            "inf" if r["global_ratio"] is None else f"{r['global_ratio']:g}",
            f"{r['imbalance_mean']:.2f}",
            f"{ratio[i]:.2f}",
            f"{r['imbalance_with_drain']:.2f}",
            pct(r["followup_stickiness"]),
            pct(r["local_hit_ratio"]),
            f"{r['ttft_p90']:.2f}",
            f"{r['tps_within_slo']:,.0f}",
        )
        for i, (lam, r) in enumerate(zip(LAMBDAS * 2, rows, strict=True))
    ]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(LAMBDAS, ratio[: len(LAMBDAS)], "o-", label="full tier")
    ax.plot(LAMBDAS, ratio[len(LAMBDAS) :], "s--", label="no tier")
    ax.axhspan(lo, hi, color="gray", alpha=0.3, label="paper's Bailian / LB")
    ax.set_yscale("log")
    ax.set_xlabel("Bailian λ (weight of the miss term)")
    ax.set_ylabel(f"imbalance / load_balance's, {AT:g}x")
    ax.legend()
    body = [
        "The paper gives Bailian's score, f = (1-λ)·load + λ·(1-hit ratio), and says the operator "
        "sets a large λ for agents, but not its value. Rule: the λ in "
        f"{', '.join(f'{x:g}' for x in LAMBDAS)} whose `imbalance_mean` at rate {AT:g}x with the "
        "full global tier, divided by load_balance's at the same point, is nearest the paper's "
        f"Bailian / load-balance-only ratio, {lo:.2f} (Fig 11c: 2.7 / 2.1) to {hi:.2f} (Fig 15b: "
        "3.0 / 2.0). A ratio, because the model's imbalance levels differ from the paper's for "
        "every policy (load_balance here "
        f"{lb[0]['imbalance_mean']:.2f}, paper 2.0–2.1). TPS is listed and chooses nothing.",
        "",
        "How the rule got here (all on this trace): a first rule, the largest λ with an absolute "
        "imbalance of at most 3.0 on 0.5–0.9, found none; its next form, the λ nearest 3.0 in "
        "absolute terms, chose 0.5 — but that imbalance still counted the drain after the last "
        "arrival (column 'with drain'), where a few instances finish the last long requests and "
        "max/mean reaches 3 for every policy. The simulator now leaves the drain out, which puts "
        "every policy near 1.5, so the rule became the ratio above. Bailian's behaviour has a "
        "threshold between 0.6 and 0.7: from 0.7 a shared-template hit outweighs any load "
        "difference and sessions pile on the instances holding their template (TTFT of minutes, "
        "no request within SLO).",
        "",
        *md_table(
            (
                "λ",
                "global tier",
                "imbalance",
                "/ load_balance",
                "with drain",
                "stickiness",
                "local hit",
                "TTFT p90 s",
                "TPS@SLO",
            ),
            table,
        ),
        "",
        f"load_balance at the same points: imbalance {lb[0]['imbalance_mean']:.2f} (full tier), "
        f"{lb[1]['imbalance_mean']:.2f} (no tier).",
        "",
        f"Chosen: λ = {chosen:g}, the default of `PolicyParams.bailian_lambda`.",
        "",
        save(fig, "bailian_lambda"),
    ]
    write("bailian_lambda", "Bailian's λ — chosen from the paper's reported imbalance", body, rows)


def fig9() -> None:
    rows = runs([Spec("load_balance", r) for r in SWEEP])
    reqs = trace()
    rpm = len(reqs) / ((reqs[-1].arrival_s - reqs[0].arrival_s) / 60) / 32
    fig, ax = plt.subplots(figsize=(5, 3.5))
    table = []
    for r in rows:
        v = r["imb60"]
        cdf(ax, v, f"{r['rate_scale'] / BASE_RATE:g}x")
        table.append(
            (
                f"{r['rate_scale'] / BASE_RATE:g}x",
                len(v),
                f"{np.median(v):.2f}",
                f"{np.percentile(v, 90):.2f}",
                f"{max(v):.2f}",
                "1.7",
                "< 2.4",
            )
        )
    ax.set_xlabel("per-window (1 min) max/mean token load")
    ax.set_ylabel("CDF of windows")
    ax.legend(title="rate scale")
    body = [
        "Per-window (1 min) load imbalance, max/mean of the tokens each instance computed "
        "(prefill computed + decode) in the window, under load_balance dispatch, fully provisioned "
        "global tier. Windows from the first to the last arrival (the drain after the last "
        "arrival is left out: the paper's trace never drains).",
        "",
        *md_table(
            ("rate scale", "windows", "median", "P90", "worst", "paper median", "paper worst"),
            table,
        ),
        "",
        save(fig, "fig9"),
        "",
        "Differences from the paper's Fig 9: the paper replays the trace on an idealised cluster "
        "dispatching by least in-flight tokens (prefill + decode) with recorded execution times; "
        "here load_balance dispatches by least in-flight requests (the router's own load signal "
        "in colocation) and execution comes from the engine model, so queueing feeds back into "
        f"load. The replayed {LIMIT:,} requests arrive at {rpm:.0f} requests/min/instance at "
        "the trace's own rate (paper: 43, never < 30); at the rate scales simulated here that is "
        f"{rpm * BASE_RATE * SWEEP[0]:.0f}–{rpm * BASE_RATE * SWEEP[-1]:.0f}.",
    ]
    write("fig9", "Figure 9 — load imbalance under load-balancing dispatch", body, rows)


def fig11() -> None:
    cells = {(p, g): best(p, g) for g in RATIOS for p in POLICIES}
    allrows = runs([Spec(p, r, g) for g in RATIOS for p in POLICIES for r in sweep(g)])
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    w = 0.2
    for i, p in enumerate(POLICIES):
        a.bar(
            np.arange(len(RATIOS)) + (i - 1.5) * w,
            [cells[(p, g)]["tps_within_slo"] / 1e3 for g in RATIOS],
            w,
            label=p,
        )
        loc, glo = cells[(p, math.inf)]["local_hit_ratio"], cells[(p, math.inf)]["global_hit_ratio"]
        b.bar(i, 100 * loc, color="C0", label="local" if i == 0 else None)
        b.bar(i, 100 * glo, bottom=100 * loc, color="C1", label="global" if i == 0 else None)
        b.bar(
            i,
            100 * (1 - loc - glo),
            bottom=100 * (loc + glo),
            color="0.85",
            label="miss" if i == 0 else None,
        )
    a.set_xticks(range(len(RATIOS)), [f"{g:g}" for g in RATIOS])
    a.set_xlabel("global / local capacity")
    a.set_ylabel("max TPS within SLO (K tokens/s)")
    a.legend()
    b.set_xticks(range(len(POLICIES)), POLICIES)
    b.set_ylabel("% of prompt tokens (full global tier)")
    b.legend()
    head = ("policy", *[f"global {g:g}" for g in RATIOS])
    tps = [
        (
            p,
            *[
                f"{cells[(p, g)]['tps_within_slo']:.0f} "
                f"@{cells[(p, g)]['rate_scale'] / BASE_RATE:g}x"
                for g in RATIOS
            ],
        )
        for p in POLICIES
    ]
    rel = []
    for g in RATIOS:
        base = max(cells[(p, g)]["tps_within_slo"] for p in POLICIES[1:])
        rel.append(f"{cells[('smetric', g)]['tps_within_slo'] / base:.3f}")
    split = [
        (
            p,
            *[
                f"{pct(cells[(p, g)]['local_hit_ratio'])} / "
                f"{pct(cells[(p, g)]['global_hit_ratio'])} / {cells[(p, g)]['imbalance_mean']:.2f}"
                for g in RATIOS
            ],
        )
        for p in POLICIES
    ]
    body = [
        "Max TPS within SLO (tokens/s) over the rate sweep "
        f"{', '.join(f'{s:g}' for s in SWEEP)} x {BASE_RATE} (full global tier; "
        f"{', '.join(f'{s:g}' for s in SHORT_SWEEP)} x at finite provisioning) per policy "
        "and provisioning (`@` = the rate scale of the max):",
        "",
        *md_table(head, tps),
        "| smetric / best baseline | " + " | ".join(rel) + " |",
        "",
        "Paper (Fig 16a): SMetric +10–16 % over the best baseline with a global store, within 1 % "
        "of Bailian with none; Fig 11a: load-balance-only within 7 % of the strongest baseline "
        "fully provisioned.",
        "",
        "Local hit / global hit / mean max-to-mean load at each policy's max-TPS point:",
        "",
        *md_table(head, split),
        "",
        "Paper: full global tier, reuse 73–75 % for all (Fig 11b), local hit SMetric 64 %, Bailian "
        "65 % (Fig 16b); no/small global tier, local hit Bailian 58 %, LMetric 33 %, "
        "load-balance-only 6 % (Fig 11b); imbalance SMetric 2.6x, Bailian 3.0x, LMetric 3.2x, "
        "load-balance-only 2.0x (Fig 15b).",
        "",
        save(fig, "fig11"),
    ]
    write(
        "fig11", "Figures 11 / 16 — max TPS within SLO vs global-tier provisioning", body, allrows
    )


def fig12() -> None:
    rows = runs([Spec(p, r) for p in POLICIES for r in SWEEP])
    at = {p: run(Spec(p, AT)) for p in POLICIES}
    paper = {"bailian": "96.6 %", "load_balance": "4.0 %"}
    table = [
        (p, *[pct(r["followup_stickiness"]) for r in rows if r["policy"] == p], paper.get(p, "—"))
        for p in POLICIES
    ]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.bar(POLICIES, [100 * at[p]["followup_stickiness"] for p in POLICIES])
    ax.set_ylabel(f"follow-ups on first-turn instance (%), rate {AT:g}x")
    body = [
        "Share of follow-up requests served by their session's first-turn instance, fully "
        "provisioned global tier, per rate scale:",
        "",
        *md_table(("policy", *[f"{s:g}x" for s in SWEEP], "paper"), table),
        "",
        save(fig, "fig12"),
    ]
    write("fig12", "Figure 12 — follow-up stickiness", body, rows)


def fig14() -> None:
    basic = Spec("smetric", AT, overload=math.inf, slack=math.inf, hit_ratio=0.0)
    rows = runs([Spec("smetric", AT), basic])
    names = ("SMetric", "SMetric (basic)")
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for n, r in zip(names, rows, strict=True):
        cdf(a, r["imb30"], n)
    a.set_xlabel("per-window (30 s) max/mean token load")
    a.set_ylabel("CDF of windows")
    a.legend()
    x = np.arange(3)
    for i, (n, r) in enumerate(zip(names, rows, strict=True)):
        b.bar(
            x + (i - 0.5) * 0.35, [r["ttft_p90"], r["ttft_p99"], r["tpot_p95"] / 10], 0.35, label=n
        )
    b.set_xticks(x, ["P90 TTFT (s)", "P99 TTFT (s)", "P95 TPOT (10 ms)"])
    b.legend()
    qs = (50, 75, 90, 99, 100)
    imb = [
        (n, *[f"{np.percentile(r['imb30'], q):.2f}" for q in qs])
        for n, r in zip(names, rows, strict=True)
    ]
    lat = [
        (
            n,
            f"{r['ttft_p90']:.2f}",
            f"{r['ttft_p99']:.2f}",
            f"{r['tpot_p95']:.1f}",
            f"{r['tps_within_slo']:.0f}",
            pct(r["followup_stickiness"]),
            pct(r["local_hit_ratio"]),
        )
        for n, r in zip(names, rows, strict=True)
    ]
    body = [
        f"SMetric (OVERLOAD 2, slack 2, HIT_RATIO 0.5) vs SMetric (basic: `--overload inf "
        f"--overload-slack inf --hit-ratio 0`), fully provisioned global tier, rate {AT:g}x.",
        "",
        "Per-window (30 s, from first to last arrival) imbalance percentiles (Fig 14):",
        "",
        *md_table(("", *[f"P{q}" if q < 100 else "max" for q in qs]), imb),
        "",
        "Paper (Fig 14): the pre-filter evens the windows above the 75th percentile.",
        "",
        *md_table(
            ("", "P90 TTFT s", "P99 TTFT s", "P95 TPOT ms", "TPS@SLO", "sticky", "local hit"), lat
        ),
        "",
        "Paper (Fig 24): 12.1 s / 45.3 s / 82.5 ms with guards vs 16.1 s / 51.2 s / 89.2 ms basic; "
        "modest good-TPS gain.",
        "",
        save(fig, "fig14"),
    ]
    write("fig14", "Figures 14 / 24 — SMetric with and without the pre-filter guards", body, rows)


def fig15() -> None:
    specs = [Spec(p, r) for p in POLICIES for r in SWEEP]
    rows = runs(specs)
    by = {(s.policy, s.rate): r for s, r in zip(specs, rows, strict=True)}
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for p in POLICIES:
        ax.plot(SWEEP, [by[(p, s)]["tps_within_slo"] / 1e3 for s in SWEEP], "o-", label=p)
    ax.set_xlabel(f"request rate (x {BASE_RATE} trace rate)")
    ax.set_ylabel("TPS within SLO (K tokens/s)")
    ax.legend()
    table = []
    for s in SWEEP:
        base = max(by[(p, s)]["tps_within_slo"] for p in POLICIES[1:])
        table.append(
            (
                f"{s:g}x",
                *[f"{by[(p, s)]['tps_within_slo']:.0f}" for p in POLICIES],
                f"{by[('smetric', s)]['tps_within_slo'] / base:.3f}",
            )
        )
    detail = [
        (
            p,
            f"{s:g}x",
            f"{r['tps']:.0f}",
            f"{r['ttft_p50']:.2f} / {r['ttft_p90']:.2f}",
            f"{r['tpot_p50']:.1f} / {r['tpot_p90']:.1f}",
            pct(r["local_hit_ratio"]),
            pct(r["global_hit_ratio"]),
            f"{r['imbalance_mean']:.2f}",
        )
        for (p, s), r in by.items()
    ]
    body = [
        "TPS within SLO (tokens/s) per policy and rate, fully provisioned global tier:",
        "",
        *md_table(("rate", *POLICIES, "smetric / best baseline"), table),
        "",
        "Paper (Fig 15a): within 1 % of the best baseline at 1.0x, +15 % at 1.5x, +4 % at 1.75x; "
        "at 2.0x all drop, SMetric slowest. Fig 15b imbalance: SMetric 2.6x, Bailian 3.0x, "
        "LMetric 3.2x, load-balance-only 2.0x.",
        "",
        save(fig, "fig15"),
        "",
        "Per run:",
        "",
        *md_table(
            (
                "policy",
                "rate",
                "TPS",
                "TTFT p50/p90 s",
                "TPOT p50/p90 ms",
                "local",
                "global",
                "imbalance",
            ),
            detail,
        ),
    ]
    write("fig15", "Figure 15 — rate sweep", body, rows)


def fig25() -> None:
    overloads = (1.0, 1.5, 2.0, 3.0, math.inf)
    hits = (0.0, 0.25, 0.5, 0.75)
    o_rows = runs([Spec("smetric", AT, overload=o) for o in overloads])
    h_rows = runs([Spec("smetric", AT, hit_ratio=h) for h in hits])
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, xs, rs, name in (
        (axes[0], overloads, o_rows, "OVERLOAD"),
        (axes[1], hits, h_rows, "HIT_RATIO"),
    ):
        lab = [f"{x:g}" for x in xs]
        loc = [100 * r["local_hit_ratio"] for r in rs]
        ax.bar(lab, loc, color="C0", label="local hit")
        ax.bar(
            lab,
            [100 * r["global_hit_ratio"] for r in rs],
            bottom=loc,
            color="C1",
            label="global hit",
        )
        ax.set_xlabel(name)
        ax.set_ylabel("% of prompt tokens")
        tw = ax.twinx()
        tw.plot(lab, [r["tps_within_slo"] / 1e3 for r in rs], "ko-")
        tw.set_ylabel("TPS within SLO (K tokens/s)")
        ax.legend(loc="lower left")

    def rows_of(xs: Sequence[float], rs: Sequence[dict[str, Any]], ref: float) -> list[Any]:
        d = next(r for x, r in zip(xs, rs, strict=True) if x == ref)["tps_within_slo"]
        return [
            (
                f"{x:g}",
                f"{r['tps_within_slo']:.0f}",
                f"{r['tps_within_slo'] / d - 1:+.1%}",
                pct(r["local_hit_ratio"]),
                pct(r["reuse_ratio"]),
                f"{r['imbalance_mean']:.2f}",
                pct(r["followup_stickiness"]),
            )
            for x, r in zip(xs, rs, strict=True)
        ]

    head = ("TPS@SLO", "vs default", "local hit", "reuse", "imbalance", "sticky")
    body = [
        f"SMetric, fully provisioned global tier, rate {AT:g}x; one parameter swept, the others at "
        "their defaults (OVERLOAD 2, slack 2, HIT_RATIO 0.5).",
        "",
        *md_table(("OVERLOAD", *head), rows_of(overloads, o_rows, 2.0)),
        "",
        *md_table(("HIT_RATIO", *head), rows_of(hits, h_rows, 0.5)),
        "",
        "Paper (Fig 25): OVERLOAD 1.0–inf keeps TPS within 6 % of the default, hit ratio 75–76 %; "
        "HIT_RATIO 0–0.75 keeps TPS within 4 %, hit ratio 75–76 %.",
        "",
        save(fig, "fig25"),
    ]
    write("fig25", "Figure 25 — OVERLOAD and HIT_RATIO sensitivity", body, o_rows + h_rows)


def acceptance() -> None:
    full = {p: best(p, math.inf) for p in POLICIES}
    none = {p: best(p, 0.0) for p in POLICIES}
    at = {p: run(Spec(p, AT)) for p in POLICIES}
    top = max(POLICIES[1:], key=lambda p: full[p]["tps_within_slo"])
    r_full = full["smetric"]["tps_within_slo"] / full[top]["tps_within_slo"]
    r_none = none["smetric"]["tps_within_slo"] / none["bailian"]["tps_within_slo"]
    st = {p: at[p]["followup_stickiness"] for p in POLICIES}
    im = {p: at[p]["imbalance_mean"] for p in POLICIES}
    ok = {True: "yes", False: "**no**"}
    rows = [
        (
            "SMetric max TPS@SLO / best baseline, full global tier",
            "≥ 1.10",
            f"{r_full:.3f} (vs {top})",
            ok[r_full >= 1.10],
        ),
        (
            "SMetric max TPS@SLO / Bailian, no global tier",
            "≥ 0.99",
            f"{r_none:.3f}",
            ok[r_none >= 0.99],
        ),
        ("stickiness bailian", "≥ 90 %", pct(st["bailian"]), ok[st["bailian"] >= 0.9]),
        ("stickiness smetric", "≥ 90 %", pct(st["smetric"]), ok[st["smetric"] >= 0.9]),
        (
            "stickiness load_balance",
            "≤ 10 %",
            pct(st["load_balance"]),
            ok[st["load_balance"] <= 0.1],
        ),
        (
            "imbalance load_balance < smetric < bailian",
            "ordered",
            f"{im['load_balance']:.2f} / {im['smetric']:.2f} / {im['bailian']:.2f}",
            ok[im["load_balance"] < im["smetric"] < im["bailian"]],
        ),
    ]
    body = [
        "Stickiness and imbalance (the simulator's `imbalance_mean`, 30 s windows) at rate "
        f"{AT:g}x with the full global tier; TPS ratios are of maxima over the rate sweep.",
        "",
        *md_table(("check", "target", "measured", "met"), rows),
    ]
    write("acceptance", "Issue 3 acceptance", body, list(full.values()) + list(none.values()))


def reuse() -> None:
    """Prompt tokens in a leading prefix shared with the session's previous request vs with an
    earlier request of another session (what any instance holding that content can serve)."""
    first: dict[int, str] = {}  # block id -> first session that sent it
    shared: set[int] = set()  # block ids sent by two or more sessions
    prev: dict[str, tuple[int, ...]] = {}
    total = own = other = 0
    for r in trace():
        p = prev.get(r.session, ())
        pairs = enumerate(zip(r.block_ids, p, strict=False))
        n_own = next((i for i, (x, y) in pairs if x != y), min(len(p), len(r.block_ids)))
        n_other = 0
        for x in r.block_ids:
            if first.get(x, r.session) == r.session and x not in shared:
                break
            n_other += 1
        total += r.input_len
        own += min(n_own * r.block_size, r.input_len)
        other += min(n_other * r.block_size, r.input_len)
        for x in r.block_ids:
            if first.setdefault(x, r.session) != r.session:
                shared.add(x)
        prev[r.session] = r.block_ids
    print(
        f"{total} prompt tokens: {own / total:.1%} shared with the session's previous request, "
        f"{other / total:.1%} with an earlier request of another session"
    )


def moves() -> None:
    """Why follow-ups leave their session's first instance when the overload guard is off: each
    move, by whether the instance it left still held as long a prefix as the one chosen."""
    params = PolicyParams(overload=math.inf, overload_slack=2.0, hit_ratio=0.5)
    inner = make_policy("smetric", params)
    seen: list[tuple[str, dict[str, int], str]] = []

    @dataclass(frozen=True, slots=True)
    class Recorder:
        name: str = "smetric"
        uses_text_tree: bool = False

        def decide(self, features: RequestFeatures, view: ClusterView) -> Decision:
            d = inner.decide(features, view)
            seen.append((d.reason, {w.url: w.hit for w in view.workers}, d.worker))
            return d

    reqs = trace()
    cfg = SimConfig(params=params, global_ratio=math.inf, window_s=WINDOW_S)
    res = Cluster(cfg, Recorder(), math.inf).run(reqs, AT * BASE_RATE)
    prev: dict[str, int] = {}
    followups = 0
    tally: dict[str, int] = {}
    order = [reqs[i] for i in arrival_order(reqs)]
    for rec, (reason, hits, chosen), req in zip(res.records, seen, order, strict=True):
        if rec.turn > 0 and rec.first_instance >= 0:
            followups += 1
            left = prev.get(req.session, rec.instance)
            if rec.instance != rec.first_instance:
                if left == rec.instance:
                    kind = "stays where an earlier move put it"
                elif reason != "sticky":
                    kind = f"moved by {reason}"
                elif hits[list(hits)[left]] == hits[chosen]:
                    kind = "moved: the instance it left ties on the longest hit"
                else:
                    kind = "moved: another instance has a longer hit"
                tally[kind] = tally.get(kind, 0) + 1
        prev[req.session] = rec.instance
    print(f"smetric, OVERLOAD inf, rate {AT:g}x, full tier: {followups} follow-ups")
    for kind, n in sorted(tally.items(), key=lambda kv: -kv[1]):
        print(f"  {n:5d} ({n / followups:.1%})  {kind}")


# in the order `all` runs them: the shared full-tier sweep first, the widest sweep last but one
FIGS: dict[str, Callable[[], None]] = {
    "bailian_lambda": bailian_lambda,
    "fig15": fig15,
    "fig9": fig9,
    "fig12": fig12,
    "fig14": fig14,
    "fig11": fig11,
    "acceptance": acceptance,
    "fig25": fig25,
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("figure", choices=(*FIGS, "all", "reuse", "moves"))
    ap.add_argument("--jobs", type=int, default=1, help="simulator runs in parallel (default 1)")
    args = ap.parse_args()
    global JOBS
    JOBS = max(1, args.jobs)
    if args.figure == "reuse":  # a diagnostic of the trace, no figure
        reuse()
    if args.figure == "moves":  # a diagnostic of SMetric's decisions, no figure
        moves()
    for name, fn in FIGS.items():
        if args.figure in (name, "all"):
            fn()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
