"""Slots kept for a session's next turn (the router's --queue-session-grace-secs) behind its
admission cap, on the on-reply cells (simulator, modelled).

    python -m benchmarks.session_slots --jobs 2      # 3 seeds x 2 rates x 6 cells (~6 min)
    python -m benchmarks.session_slots --report-only

on_reply_classes.md found that with follow-ups sent on the reply a first-come queue, at the
router or in the workers, spreads the wait over every session, and each session that waits
loses its history on its holder; `lmetric` leads `smetric` by putting the wait on a few sessions
instead. Kept slots (admission/slots.py) make that trade on purpose: with the cap
(--max-concurrent-requests) reached, the slot of a request that ends is kept GRACE_S for the
request that continues it, which takes it without queueing; a slot nobody claims goes back to
the queue. The simulator runs the router's own KeptSlots, keyed as the router keys them (the
ended prompt's last full page hash, claimed by a follow-up whose prompt holds that page), so a
sub-agent re-using its parent's context may take the slot too.

Everything else is the simulator's model of the router's admission (sim/admission.py: its queue
order, no queue timeout). Writes benchmarks/results/session-slots.md: `smetric` without a cap,
behind the plain cap and with kept slots, and the paper's `lmetric`, per seed and mean [min-max].
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import repro_colocated as rc
from benchmarks.on_reply_classes import setting, ttft, within_ttft_slo
from smetric_router.policies import make_policy
from smetric_router.sim.cluster import Cluster
from smetric_router.sim.metrics import summarize
from smetric_router.sim.report import spread

RATES = (1.0, 1.25)
CAPS = (48, 56)  # 6 and 7 requests an instance of 8: below what an instance's KV holds
GRACE_S = 1.0  # on the reply the next turn comes at once; a gap longer than this frees the slot


def spec_of(cap: int, rate: float, seed: int) -> rc.Spec:
    """cap 0: no admission; -1: `lmetric` without one."""
    policy = "lmetric" if cap < 0 else "smetric"
    return rc.Spec(policy, rate, math.inf, seed, instances=rc.SCALE_INSTANCES,
                   follow_ups="on-reply", cap=max(cap, 0))  # fmt: skip


def cache_path(cap: int, grace: float, rate: float, seed: int) -> Path:
    return rc.CACHE / f"{spec_of(cap, rate, seed).key()}-slots{grace:g}.json"


def run(cap: int, grace: float, rate: float, seed: int) -> dict[str, Any]:
    """One run: grace 0 is the plain cap; the cache key names both."""
    spec = spec_of(cap, rate, seed)
    policy = spec.policy
    path = cache_path(cap, grace, rate, seed)
    cached = rc.load_cached(path)
    if cached is not None:
        return cached
    cfg = replace(rc.sim_config(spec), queue_session_grace_s=grace)
    pol = make_policy(policy, cfg.params)
    t0 = time.perf_counter()
    sim = Cluster(cfg, pol, spec.ratio, timing=rc.timing(spec, cfg))
    res = sim.run(rc.trace(seed), spec.stretch())
    waits = np.array([ttft(r) for r in res.records])
    out = {
        "cap": cap, "grace": grace, "rate": rate, "seed": seed,
        "tps_within_slo": summarize(res, cfg.slo, policy, rate, spec.ratio)["tps_within_slo"],
        "ttft_ok": within_ttft_slo(res.records, cfg.slo),
        "ttft_p90": float(np.percentile(waits, 90)), "ttft_p99": float(np.percentile(waits, 99)),
        "ttft_max": float(waits.max()), "router_wait_max": res.longest_router_wait_s,
        "claims": res.kept_slot_claims,
        "requests": len(res.records), "wall_s": time.perf_counter() - t0,
    }  # fmt: skip
    rc.store(path, out)
    print(f"{path.stem}: {out['wall_s']:.0f} s", flush=True)
    return out


def cells() -> list[tuple[int, float]]:
    """(cap, grace): no admission, the plain caps, the caps with kept slots, and `lmetric` (-1)."""
    return [(0, 0.0), *((c, 0.0) for c in CAPS), *((c, GRACE_S) for c in CAPS), (-1, 0.0)]


def _run(args: tuple[int, float, float, int]) -> dict[str, Any]:
    return run(*args)


def _name(cap: int, grace: float) -> str:
    if cap < 0:
        return "lmetric, no cap"
    if not cap:
        return "smetric, no cap"
    return f"smetric, cap {cap}" + (f", slots kept {grace:g} s" if grace else "")


def report(rows: Sequence[dict[str, Any]]) -> list[str]:
    by = {(r["cap"], r["grace"], r["rate"], r["seed"]): r for r in rows}
    seeds = sorted({r["seed"] for r in rows})
    head = ("rate", "router", "TPS within SLO", "/ smetric, no cap", "per seed",
            "within TTFT SLO", "TTFT p90 (s)", "TTFT p99 (s)", "TTFT max (s)",
            "longest wait at the router (s)", "slots claimed")  # fmt: skip
    table = []
    for rate in RATES:
        for cap, grace in cells():
            cell = [by[(cap, grace, rate, t)] for t in seeds]
            ratio = [r["tps_within_slo"] / by[(0, 0.0, rate, r["seed"])]["tps_within_slo"]
                     for r in cell]  # fmt: skip
            table.append((
                f"{rate:g}x", _name(cap, grace),
                spread(r["tps_within_slo"] for r in cell).fmt(",.0f"),
                spread(ratio).fmt(), " / ".join(f"{x:.3f}" for x in ratio),
                spread(r["ttft_ok"] for r in cell).pct(),
                spread(r["ttft_p90"] for r in cell).fmt(".1f"),
                spread(r["ttft_p99"] for r in cell).fmt(".0f"),
                spread(r["ttft_max"] for r in cell).fmt(".0f"),
                spread(r["router_wait_max"] for r in cell).fmt(".0f"),
                spread(r["claims"] / r["requests"] for r in cell).pct(),
            ))  # fmt: skip
    return rc.md_table(head, table)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--jobs", type=int, default=1, help="simulations in parallel (processes)")
    ap.add_argument("--report-only", action="store_true",
                    help="render from cached runs only; fail if one is missing")  # fmt: skip
    args = ap.parse_args(argv)
    todo = [(c, g, r, t) for r in RATES for c, g in cells() for t in rc.SEEDS]
    missing = [x for x in todo if not cache_path(*x).exists()]
    if args.report_only and missing:
        raise SystemExit(f"--report-only: {len(missing)} runs not cached, e.g. {missing[0]}")
    if args.jobs > 1 and len(missing) > 1:
        rc.fork_map(_run, missing, args.jobs, (seed for *_, seed in missing))
    rows = [run(*x) for x in todo]
    wall = sum(r["wall_s"] for r in rows) / 60
    lines = [
        "# Slots kept for a session's next turn behind the router's admission cap "
        "(simulator, modelled)",
        "",
        f"Command: `python -m benchmarks.session_slots --jobs 2` at commit {rc.commit()} (model "
        f"hash {rc.CODE_VERSION['model']}; {len(rows)} runs, {wall:.1f} min of simulation on "
        "the shared 2-core machine). Simulated, not measured. Kept slots: the router's "
        "`--queue-session-grace-secs`, modelled with its own KeptSlots (admission/slots.py).",
        "",
        f"Setting: on_reply_classes.md's: {setting()} The cap "
        "is the router's `--max-concurrent-requests` with its queue order and first-turn ceiling "
        f"(5 s), no queue timeout; kept slots wait {GRACE_S:g} s for their claim. Mean "
        "[min–max] over the trace seeds; the ratios per seed, seeds in order.",
        "",
        *report(rows),
    ]
    out = rc.RESULTS / "session-slots.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
