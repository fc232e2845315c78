"""Where the paper's `lmetric` gains on `smetric` when follow-ups come on the reply (simulator,
modelled).

    python -m benchmarks.on_reply_classes --jobs 2     # 3 seeds x 6 cells x 2 rates (~10 min)
    python -m benchmarks.on_reply_classes --report-only

The priority figure (benchmarks.repro_colocated priority) found the LMetric paper's `lmetric`
1.33x `smetric`'s max TPS within SLO on 8 instances with a full global tier once each follow-up
is sent the moment its previous reply ends (bench_serving's multi-turn client), where it is
0.96x at the trace's own times. This replays the same cells with every decision recorded and
splits the requests by what the router saw when it placed them:

- first turn: the request carries no assistant reply (the router's turn 0);
- follow-up, held: some worker still holds more than HIT_RATIO x the history it carries
  (the eviction guard's threshold) in its local tier;
- follow-up, in the global tier only: no worker holds it locally, the global tier does;
- follow-up, held nowhere: mostly the sessions that began before the trace's window (their
  earlier turns were never computed in the cluster), and any the global tier had not received.

Per class: how many, TTFT p50 / p90, the share within the TTFT SLO and the mean in-flight load
per instance when they were placed; per run: TTFT p99 and max, and how unevenly the slow
requests fall (the share of the worst instance's requests over 30 s). Beside them `smetric`
behind the router's admission cap (--max-concurrent-requests, CAPS; sim/admission.py), which
holds the requests beyond it at the router instead of in the instances' queues and refuses
(429) those that waited its --queue-timeout-secs; TTFTs are of the requests placed, the refused
in a column of their own. Mean [min-max]
over the trace seeds. Runs are cached beside the study's (CACHE, key + "-classes"). Writes
benchmarks/results/on-reply-classes.md.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks import repro_colocated as rc
from smetric_router.core.types import ClusterView, Decision, RequestFeatures
from smetric_router.policies import make_policy
from smetric_router.policies.base import Policy
from smetric_router.sim.cluster import Cluster, RequestRecord
from smetric_router.sim.config import Slo
from smetric_router.sim.metrics import summarize
from smetric_router.sim.report import spread

POLICIES = ("smetric", "lmetric", "lmetric-inflight")
RATES = (1.0, 1.25)  # the on-reply sweep's knee for smetric and the step past it
# `smetric` behind the router's admission cap (--max-concurrent-requests): 5, 7 and 9 requests
# per instance, about 0.6x, 0.85x and 1.1x of what an instance's KV holds of ~33K-token prompts
CAPS = (40, 56, 72)
SLOW_S = 30.0
CLASSES = ("first turn", "follow-up, held", "follow-up, in the global tier only",
           "follow-up, held nowhere")  # fmt: skip


def classify(features: RequestFeatures, view: ClusterView, hit_ratio: float) -> str:
    """What the router saw of a request when it placed it (the module's docstring)."""
    if features.turn == 0 or features.est_hit <= 0:
        return CLASSES[0]
    held = hit_ratio * features.est_hit
    if max(w.hit for w in view.workers) > held:
        return CLASSES[1]
    if max((w.l3_hit or 0) for w in view.workers) > held:
        return CLASSES[2]
    return CLASSES[3]


@dataclass(slots=True)
class Recorder:
    """The policy under test, unchanged, with each decision's class and the mean in-flight load
    per instance at that moment, in decision order (the simulator's records' order)."""

    inner: Policy
    hit_ratio: float
    classes: list[str] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def uses_text_tree(self) -> bool:
        return self.inner.uses_text_tree

    def needs_l3(self, features: RequestFeatures, view: ClusterView) -> bool:
        return self.inner.needs_l3(features, view)

    def decide(self, features: RequestFeatures, view: ClusterView) -> Decision:
        self.classes.append(classify(features, view, self.hit_ratio))
        self.loads.append(sum(w.load for w in view.workers) / len(view.workers))
        return self.inner.decide(features, view)


def ttft(r: RequestRecord) -> float:
    return r.first_token - r.arrival if r.first_token >= 0 else math.inf


def placed(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The requests the router placed: those its admission refused after its queue timeout (the
    client got a 429) are counted apart, not as an endless TTFT."""
    return [r for r in records if not r.refused]


def refused_share(records: Sequence[RequestRecord]) -> float:
    return sum(r.refused for r in records) / len(records) if records else 0.0


def within_ttft_slo(records: Sequence[RequestRecord], slo: Slo) -> float:
    """The share of requests whose TTFT met the SLO (one never answered did not)."""
    return float(np.mean([ttft(r) <= slo.ttft_limit(r.input_len) for r in records]))


def class_rows(
    records: Sequence[RequestRecord], classes: Sequence[str], loads: Sequence[float], slo: Slo
) -> dict[str, dict[str, float]]:
    """Per class: n, TTFT p50 / p90 (s), the share within the TTFT SLO, the mean load placed at."""
    out: dict[str, dict[str, float]] = {}
    for name in CLASSES:
        picked = [(r, ld) for r, c, ld in zip(records, classes, loads, strict=True) if c == name]
        if not picked:
            out[name] = {"n": 0.0, "p50": math.nan, "p90": math.nan, "ok": math.nan,
                         "load": math.nan}  # fmt: skip
            continue
        t = np.array([ttft(r) for r, _ in picked])
        out[name] = {
            "n": float(len(picked)),
            "p50": float(np.percentile(t, 50)),
            "p90": float(np.percentile(t, 90)),
            "ok": within_ttft_slo([r for r, _ in picked], slo),
            "load": float(np.mean([ld for _, ld in picked])),
        }
    return out


def worst_slow_share(records: Sequence[RequestRecord], instances: int) -> float:
    """The largest share, over instances, of an instance's requests whose TTFT was over SLOW_S."""
    shares = []
    for i in range(instances):
        mine = [ttft(r) > SLOW_S for r in records if r.instance == i]
        shares.append(float(np.mean(mine)) if mine else 0.0)
    return max(shares)


def spec(policy: str, rate: float, seed: int, cap: int = 0) -> rc.Spec:
    return rc.Spec(policy, rate, math.inf, seed, instances=rc.SCALE_INSTANCES,
                   follow_ups="on-reply", cap=cap)  # fmt: skip


def label(policy: str, cap: int) -> str:
    return f"{policy} + admission cap {cap}" if cap else policy


def specs() -> list[rc.Spec]:
    plain = [spec(p, r, t) for r in RATES for p in POLICIES for t in rc.SEEDS]
    return plain + [spec("smetric", r, t, c) for r in RATES for c in CAPS for t in rc.SEEDS]


def run(s: rc.Spec) -> dict[str, Any]:
    path = rc.CACHE / f"{s.key()}-classes.json"
    cached = rc.load_cached(path)
    if cached is not None:
        return cached
    cfg = rc.sim_config(s)
    rec = Recorder(make_policy(s.policy, cfg.params), cfg.params.hit_ratio)
    t0 = time.perf_counter()
    res = Cluster(cfg, rec, s.ratio, timing=rc.timing(s, cfg)).run(rc.trace(s.seed), s.stretch())
    served = placed(res.records)
    t = np.array([ttft(r) for r in served])
    out = {
        "policy": label(s.policy, s.cap), "rate": s.rate, "seed": s.seed,
        "tps_within_slo": summarize(res, cfg.slo, s.policy, s.rate, s.ratio)["tps_within_slo"],
        "ttft_p99": float(np.percentile(t, 99)), "ttft_max": float(t.max()),
        "worst_slow_share": worst_slow_share(served, cfg.instances),
        "ttft_ok": within_ttft_slo(res.records, cfg.slo),
        "router_wait_max": res.longest_router_wait_s,
        "refused": refused_share(res.records),
        "classes": class_rows(served, rec.classes, rec.loads, cfg.slo),
        "wall_s": time.perf_counter() - t0,
    }  # fmt: skip
    rc.store(path, out)
    print(f"{s.key()}-classes: {out['wall_s']:.0f} s", flush=True)
    return out


def runs(specs: Sequence[rc.Spec], jobs: int) -> list[dict[str, Any]]:
    todo = [s for s in specs if not (rc.CACHE / f"{s.key()}-classes.json").exists()]
    if jobs > 1 and len(todo) > 1:
        rc.fork_map(run, todo, jobs, ((s.seed, 0.0) for s in todo))
    return [run(s) for s in specs]


def report(rows: Sequence[dict[str, Any]]) -> list[str]:
    by = {(r["policy"], r["rate"], r["seed"]): r for r in rows}
    seeds = sorted({r["seed"] for r in rows})
    head = ("rate", "policy", "TPS within SLO", "/ smetric", "within TTFT SLO",
            "TTFT p99 (s)", "TTFT max (s)", "worst instance: share over 30 s",
            "longest wait at the router (s)", "refused (429 after the queue timeout)")  # fmt: skip
    table = []
    names = [*POLICIES, *(label("smetric", c) for c in CAPS)]
    for rate in RATES:
        for p in names:
            cell = [by[(p, rate, t)] for t in seeds]
            ref = [by[("smetric", rate, t)]["tps_within_slo"] for t in seeds]
            table.append((
                f"{rate:g}x", p, spread(r["tps_within_slo"] for r in cell).fmt(",.0f"),
                spread(r["tps_within_slo"] / x for r, x in zip(cell, ref, strict=True)).fmt(),
                spread(r["ttft_ok"] for r in cell).pct(),
                spread(r["ttft_p99"] for r in cell).fmt(".0f"),
                spread(r["ttft_max"] for r in cell).fmt(".0f"),
                spread(r["worst_slow_share"] for r in cell).pct(),
                spread(r["router_wait_max"] for r in cell).fmt(".0f"),
                spread(r["refused"] for r in cell).pct(),
            ))  # fmt: skip
    body = ["## Per run", "", *rc.md_table(head, table), "", "## Per class", ""]
    head2 = ("rate", "policy", "class", "requests", "TTFT p50 (s)", "TTFT p90 (s)",
            "within TTFT SLO", "mean in flight per instance when placed")  # fmt: skip
    table2 = []
    for rate in RATES:
        for p in names:
            for c in CLASSES:
                cell = [by[(p, rate, t)]["classes"][c] for t in seeds]
                table2.append((
                    f"{rate:g}x", p, c, spread(x["n"] for x in cell).fmt(",.0f"),
                    spread(x["p50"] for x in cell).fmt(".2f"),
                    spread(x["p90"] for x in cell).fmt(".1f"),
                    spread(x["ok"] for x in cell).pct(),
                    spread(x["load"] for x in cell).fmt(".1f"),
                ))  # fmt: skip
    return body + rc.md_table(head2, table2)


def setting() -> str:
    """The on-reply cells' setting, as the results files state it."""
    return (
        f"trace `{rc.STUDY.command('S')}` for S in {', '.join(map(str, rc.SEEDS))}, "
        f"{rc.SCALE_INSTANCES} instances, profile h20-qwen3-coder-30b-a3b, a full global tier "
        "(paper mode), each follow-up sent the moment its previous reply ends; rate 1.0x = "
        f"{rc.BASE_RATE} x the trace's arrival rate x {rc.SCALE_INSTANCES}/32. SLO TTFT 2 s + "
        "0.12 ms per input token, TPOT 30 ms."
    )


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--jobs", type=int, default=1, help="simulations in parallel (processes)")
    ap.add_argument("--report-only", action="store_true",
                    help="render from cached runs only; fail if one is missing")  # fmt: skip
    args = ap.parse_args(argv)
    todo = specs()
    if args.report_only:
        missing = [s.key() for s in todo if not (rc.CACHE / f"{s.key()}-classes.json").exists()]
        if missing:
            raise SystemExit(f"--report-only: {len(missing)} runs not cached, e.g. {missing[0]}")
    rows = runs(todo, args.jobs)
    wall = sum(r["wall_s"] for r in rows) / 60
    lines = [
        "# Where `lmetric` gains when follow-ups come on the reply (simulator, modelled)",
        "",
        f"Command: `python -m benchmarks.on_reply_classes --jobs 2` at commit {rc.commit()} "
        f"(model hash {rc.CODE_VERSION['model']}; {len(rows)} runs, {wall:.1f} min of "
        "simulation on the shared 2-core machine). Simulated, not measured.",
        "",
        "Setting: the priority figure's on-reply cells without priority, and `smetric` behind "
        "the router's admission cap (`--max-concurrent-requests`, modelled with the router's "
        "own queue order and its 60-s queue timeout, after which a request is refused and its "
        "client sends the next turn; TTFTs are of the requests placed; "
        f"smetric_router/sim/NOTES.md): {setting()} Classes by what the router "
        "saw when it placed the request (benchmarks/on_reply_classes.py). Mean [min–max] over "
        "the trace seeds.",
        "",
        *report(rows),
    ]
    out = rc.RESULTS / "on-reply-classes.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
