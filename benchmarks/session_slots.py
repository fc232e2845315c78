"""Slots kept for a session's next turn (the router's --queue-session-grace-secs) behind its
admission cap, on the on-reply cells (simulator, modelled).

    python -m benchmarks.session_slots --jobs 2      # 93 runs (~30 min)
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
order and its queue timeout, after which a request is refused, a 429, and its client sends the
next turn at once, as bench_serving does; the report counts them apart from the TTFTs).
Writes benchmarks/results/session-slots.md: `smetric` without a cap, behind the plain cap and
with kept slots, and the paper's `lmetric`, with the full global tier and without one (there
also `lmetric-inflight`, the stronger baseline where nothing but the worker holds a history),
per seed and mean [min-max]; why the plain cap does
not stop the collapse without a tier, from the sessions it leaves open and the history their
follow-ups find; and the cap with kept slots swept in size against what the instances' KV holds.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import repro_colocated as rc
from benchmarks.on_reply_classes import placed, setting, ttft, within_ttft_slo
from smetric_router.policies import make_policy
from smetric_router.router.config import RouterConfig
from smetric_router.sim.cluster import Cluster, RequestRecord, engine_setup
from smetric_router.sim.config import Slo
from smetric_router.sim.metrics import summarize, tpot_ms
from smetric_router.sim.report import spread
from smetric_router.traces.schema import TraceRequest

RATES = (1.0, 1.25)
# the cap with kept slots swept at one rate past the knee with the tier and one without
SIZES = (32, 40, 48, 56, 64)
SIZE_POINTS = ((math.inf, 1.25), (0.0, 0.75))
NO_TIER_RATES = (0.75, 1.0)  # without a tier `smetric` without a cap falls over sooner
CAPS = (48, 56)  # 6 and 7 requests an instance of 8: below what an instance's KV holds
GRACE_S = 1.0  # on the reply the next turn comes at once; a gap longer than this frees the slot
# the router refuses (429) a request that waited this long in its queue, and so does the
# simulator (SimConfig.queue_timeout_s, the same default)
TIMEOUT_S = next(
    float(str(f.default)) for f in fields(RouterConfig) if f.name == "queue_timeout_secs"
)


@dataclass(frozen=True, slots=True)
class Cell:
    policy: str
    cap: int = 0  # the router's --max-concurrent-requests (0: no admission)
    grace: float = 0.0  # its --queue-session-grace-secs (0: the plain cap)
    # its --queue-first-turn-ceiling-secs (None: its default); inf: first turns never pass
    # follow-ups, to see whether the ceiling is what lets new sessions crowd out running ones
    ceiling: float | None = None

    def name(self) -> str:
        if not self.cap:
            return f"{self.policy}, no cap"
        slots = f", slots kept {self.grace:g} s" if self.grace else ""
        ceiling = "" if self.ceiling is None else f", first-turn ceiling {self.ceiling:g} s"
        return f"{self.policy}, cap {self.cap}{slots}{ceiling}"


NO_CAP = Cell("smetric")


def cells(ratio: float) -> list[Cell]:
    """No admission, the plain caps, the caps with kept slots, and the baselines (with the full
    tier the paper's `lmetric`; without one `lmetric-inflight` too, and the plain cap with its
    first-turn ceiling off)."""
    caps = CAPS if ratio else CAPS[:1]
    baselines = ("lmetric",) if ratio else ("lmetric", "lmetric-inflight")
    no_ceiling = () if ratio else (Cell("smetric", CAPS[0], ceiling=math.inf),)
    return [
        NO_CAP,
        *(Cell("smetric", c) for c in caps),
        *no_ceiling,
        *(Cell("smetric", c, GRACE_S) for c in caps),
        *(Cell(p) for p in baselines),
    ]


def rates(ratio: float) -> tuple[float, ...]:
    return RATES if ratio else NO_TIER_RATES


def spec_of(cell: Cell, ratio: float, rate: float, seed: int) -> rc.Spec:
    return rc.Spec(cell.policy, rate, ratio, seed, instances=rc.SCALE_INSTANCES,
                   follow_ups="on-reply", cap=cell.cap)  # fmt: skip


Key = tuple[Cell, float, float, int]  # cell, tier ratio, rate, seed


def cache_path(cell: Cell, ratio: float, rate: float, seed: int) -> Path:
    ceiling = "" if cell.ceiling is None else f"-ceiling{cell.ceiling:g}"
    return rc.CACHE / f"{spec_of(cell, ratio, rate, seed).key()}-slots{cell.grace:g}{ceiling}.json"


def time_mean(spans: Sequence[tuple[float, float]]) -> float:
    """How many of the (start, end) spans are open at once, averaged over their whole extent."""
    if not spans:
        return 0.0
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    area, open_now, last = 0.0, 0, edges[0][0]
    for t, step in edges:
        area += open_now * (t - last)
        open_now, last = open_now + step, t
    extent = edges[-1][0] - edges[0][0]
    return area / extent if extent > 0 else 0.0


def mean_wait(records: Sequence[RequestRecord]) -> float:
    return float(np.mean([r.router_wait for r in records])) if records else 0.0


def session_columns(
    records: Sequence[RequestRecord], reqs: Sequence[TraceRequest]
) -> dict[str, float]:
    """What the cap does to sessions: how many run at once (first request placed on an instance
    to last reply ended: a session whose first turn still waits at the router holds nothing
    there yet), how much of the history a follow-up carries it found on its instance's own
    tiers, and how long each turn class waited at the router."""
    went = placed(records)  # a refused request holds no span and finds no history
    spans: dict[str, tuple[float, float]] = {}
    for r in went:
        sid = reqs[r.trace_index].session
        start = r.arrival + r.router_wait
        a, b = spans.get(sid, (start, r.finish))
        spans[sid] = (min(a, start), max(b, r.finish))
    follow = [r for r in went if r.turn > 0]
    carried = sum(reqs[r.trace_index].history_len for r in follow)
    found = sum(min(r.cached_local, reqs[r.trace_index].history_len) for r in follow)
    return {
        "sessions_running": time_mean(list(spans.values())),
        "history_found": found / carried if carried else 0.0,
        # the refused waited too: the timeout, then the 429
        "wait_follow_up": mean_wait([r for r in records if r.turn > 0]),
        "wait_first": mean_wait([r for r in records if r.turn == 0]),
    }


def within_tpot_slo(records: Sequence[RequestRecord], limit_ms: float) -> float:
    """The share of the requests with a TPOT (two output tokens or more, served) within its SLO:
    what a larger decode batch costs, which the TTFT columns do not show."""
    per = [p for p in map(tpot_ms, placed(records)) if p is not None]
    return float(np.mean([p <= limit_ms for p in per])) if per else 0.0


def cached(cell: Cell, ratio: float, rate: float, seed: int) -> dict[str, Any] | None:
    """A run's cached row; None where it was never run or was run before the TPOT columns."""
    row = rc.load_cached(cache_path(cell, ratio, rate, seed))
    return row if row is not None and "tpot_ok" in row else None


def run(cell: Cell, ratio: float, rate: float, seed: int) -> dict[str, Any]:
    spec = spec_of(cell, ratio, rate, seed)
    path = cache_path(cell, ratio, rate, seed)
    row = cached(cell, ratio, rate, seed)
    if row is not None:
        return row
    cfg = replace(rc.sim_config(spec), queue_session_grace_s=cell.grace)
    if cell.ceiling is not None:
        cfg = replace(cfg, queue_first_turn_ceiling_s=cell.ceiling)
    pol = make_policy(cell.policy, cfg.params)
    t0 = time.perf_counter()
    sim = Cluster(cfg, pol, spec.ratio, timing=rc.timing(spec, cfg))
    res = sim.run(rc.trace(seed), spec.stretch())
    waits = np.array([ttft(r) for r in placed(res.records)])
    row = summarize(res, cfg.slo, cell.policy, rate, spec.ratio)
    out = {
        "policy": cell.policy, "cap": cell.cap, "grace": cell.grace, "ratio": ratio,
        "rate": rate, "seed": seed, "tps_within_slo": row["tps_within_slo"],
        "ttft_ok": within_ttft_slo(res.records, cfg.slo),
        "tpot_ok": within_tpot_slo(res.records, cfg.slo.tpot_ms), "tpot_p90": row["tpot_p90"],
        "ttft_p90": float(np.percentile(waits, 90)), "ttft_p99": float(np.percentile(waits, 99)),
        "ttft_max": float(waits.max()), "router_wait_max": res.longest_router_wait_s,
        "past_timeout": sum(r.refused for r in res.records),
        "claims": res.kept_slot_claims, **session_columns(res.records, rc.trace(seed)),
        "requests": len(res.records), "wall_s": time.perf_counter() - t0,
    }  # fmt: skip
    rc.store(path, out)
    print(f"{path.stem}: {out['wall_s']:.0f} s", flush=True)
    return out


def keys() -> list[Key]:
    return [(c, ratio, rate, seed) for ratio in (math.inf, 0.0) for rate in rates(ratio)
            for c in cells(ratio) for seed in rc.SEEDS]  # fmt: skip


def size_keys() -> list[Key]:
    return [(Cell("smetric", c, GRACE_S), ratio, rate, seed) for ratio, rate in SIZE_POINTS
            for c in SIZES for seed in rc.SEEDS]  # fmt: skip


def kv_holds(seed: int) -> float:
    """Mean prompts of the trace that the instances' GPU KV holds at once: the cap
    docs/admission.md says to start from."""
    spec = spec_of(NO_CAP, math.inf, RATES[0], seed)
    cfg = rc.sim_config(spec)
    engine, _ = engine_setup(cfg, rc.timing(spec, cfg), spec.ratio)
    prompt = float(np.mean([r.input_len for r in rc.trace(seed)]))
    return spec.instances * engine.gpu_kv_tokens / prompt


def versus_no_cap(
    rows: dict[Key, dict[str, Any]], cell: Cell, ratio: float, rate: float
) -> tuple[list[dict[str, Any]], list[float]]:
    """A cell's runs, seeds in order, and each one's TPS within SLO over `smetric` without a cap
    on the same seed."""
    got = [rows[(cell, ratio, rate, t)] for t in rc.SEEDS]
    base = [rows[(NO_CAP, ratio, rate, t)]["tps_within_slo"] for t in rc.SEEDS]
    return got, [g["tps_within_slo"] / b for g, b in zip(got, base, strict=True)]


def sizes(rows: dict[Key, dict[str, Any]]) -> list[str]:
    head = ("setting", *(f"cap {c}" for c in SIZES), "lmetric, no cap")
    table, slo_table = [], []
    for ratio, rate in SIZE_POINTS:
        tier = "full tier" if ratio else "no tier"
        slos = []
        for cell in (*(Cell("smetric", c, GRACE_S) for c in SIZES), Cell("lmetric")):
            got = [rows[(cell, ratio, rate, t)] for t in rc.SEEDS]
            slos.append(
                f"{spread(g['ttft_ok'] for g in got).pct()} / "
                f"{spread(g['tpot_ok'] for g in got).pct()} / "
                f"{spread(g['tpot_p90'] for g in got).fmt('.0f')}"
            )
        slo_table.append((f"{tier}, {rate:g}x", *slos))
        cols = []
        for c in SIZES:
            got, ratios = versus_no_cap(rows, Cell("smetric", c, GRACE_S), ratio, rate)
            cols.append(
                f"{spread(g['tps_within_slo'] for g in got).fmt(',.0f')} "
                f"({spread(g['past_timeout'] / g['requests'] for g in got).pct()} refused; "
                f"{spread(ratios).fmt()}x no cap)"
            )
        lm, lm_ratios = versus_no_cap(rows, Cell("lmetric"), ratio, rate)
        cols.append(
            f"{spread(g['tps_within_slo'] for g in lm).fmt(',.0f')} "
            f"({spread(lm_ratios).fmt()}x no cap)"
        )
        table.append((f"{tier}, {rate:g}x", *cols))
    holds = spread(kv_holds(t) for t in rc.SEEDS).fmt(".0f")
    return [
        f"TPS within SLO of `smetric` behind caps of {', '.join(map(str, SIZES))} with kept "
        f"slots ({GRACE_S:g} s), the share of requests refused after the router's {TIMEOUT_S:g}-s "
        "queue timeout, and the ratio to `smetric` without a cap. The instances' GPU KV holds "
        f"{holds} of the trace's mean prompts at once (instances x GPU KV tokens / mean prompt "
        "tokens, per seed): the size docs/admission.md starts from.",
        "",
        *rc.md_table(head, table),
        "",
        "Which SLO a larger cap misses: the share of requests within the TTFT SLO (a refused one "
        "is not) / the share of the placed requests with a TPOT within its SLO "
        f"({Slo().tpot_ms:g} ms) / TPOT p90 "
        "(ms), the same cells:",
        "",
        *rc.md_table(head, slo_table),
    ]


def _run(key: Key) -> dict[str, Any]:
    return run(*key)


def report(rows: dict[Key, dict[str, Any]], ratio: float) -> list[str]:
    head = ("rate", "router", "TPS within SLO", "/ smetric, no cap", "per seed",
            "within TTFT SLO", "within TPOT SLO", "TTFT p90 (s)", "TTFT p99 (s)", "TTFT max (s)",
            "longest wait at the router (s)", f"refused (429 after {TIMEOUT_S:g} s at the router)",
            "slots claimed", "sessions running (mean)", "follow-ups' history on their instance",
            "router wait, follow-ups / first turns (mean s)")  # fmt: skip
    table = []
    for rate in rates(ratio):
        for c in cells(ratio):
            cell, ratios = versus_no_cap(rows, c, ratio, rate)
            table.append((
                f"{rate:g}x", c.name(),
                spread(r["tps_within_slo"] for r in cell).fmt(",.0f"),
                spread(ratios).fmt(), " / ".join(f"{x:.3f}" for x in ratios),
                spread(r["ttft_ok"] for r in cell).pct(),
                spread(r["tpot_ok"] for r in cell).pct(),
                spread(r["ttft_p90"] for r in cell).fmt(".1f"),
                spread(r["ttft_p99"] for r in cell).fmt(".0f"),
                spread(r["ttft_max"] for r in cell).fmt(".0f"),
                spread(r["router_wait_max"] for r in cell).fmt(".0f"),
                spread(r["past_timeout"] / r["requests"] for r in cell).pct(),
                spread(r["claims"] / r["requests"] for r in cell).pct(),
                spread(r["sessions_running"] for r in cell).fmt(".0f"),
                spread(r["history_found"] for r in cell).pct(),
                f"{spread(r['wait_follow_up'] for r in cell).fmt('.1f')} / "
                f"{spread(r['wait_first'] for r in cell).fmt('.1f')}",
            ))  # fmt: skip
    return rc.md_table(head, table)


def begun_before(reqs: Sequence[TraceRequest]) -> float:
    """The share of the window's sessions whose first request in it carries a history: begun
    before the window, a follow-up to the router."""
    first: dict[str, TraceRequest] = {}
    for r in reqs:
        first.setdefault(r.session, r)
    return sum(r.history_len > 0 for r in first.values()) / len(first) if first else 0.0


def reading(rows: dict[Key, dict[str, Any]]) -> list[str]:
    """Why the plain cap does not stop the collapse without a tier, in the runs' own numbers."""
    rate = NO_TIER_RATES[0]

    def mean(cell: Cell, field: str) -> float:
        return float(np.mean([rows[(cell, 0.0, rate, t)][field] for t in rc.SEEDS]))

    plain, slots = Cell("smetric", CAPS[0]), Cell("smetric", CAPS[0], GRACE_S)
    no_ceiling = Cell("smetric", CAPS[0], ceiling=math.inf)
    before = float(np.mean([begun_before(rc.trace(t)) for t in rc.SEEDS]))
    return [
        f"Why the plain cap does not stop the collapse (means over the seeds at {rate:g}x): it "
        "bounds the requests in flight, not the sessions. With follow-ups sent on the reply "
        "each session's next turn queues behind every other running session's "
        f"({mean(plain, 'wait_follow_up'):.0f} s at the router for a follow-up, "
        f"{mean(plain, 'wait_first'):.1f} s for a first turn, which passes follow-ups at the "
        f"5-s ceiling), so new sessions keep starting: {mean(plain, 'sessions_running'):.0f} "
        f"run at once behind the cap of {CAPS[0]}, {mean(NO_CAP, 'sessions_running'):.0f} "
        "without it. While a follow-up waits, the requests admitted before it evict its history "
        f"from its instance, which finds {mean(plain, 'history_found'):.0%} of what it carries "
        "and recomputes the rest; the extra prefill keeps the queue long. With the ceiling off "
        f"first turns never pass follow-ups (they wait {mean(no_ceiling, 'wait_first'):,.0f} s), "
        f"yet the window's sessions begun before it ({before:.0%} of them: their first request "
        "in the window carries a history, so the router sees a follow-up) are enough: "
        f"{mean(no_ceiling, 'sessions_running'):.0f} running, "
        f"{mean(no_ceiling, 'history_found'):.0%} found, "
        f"{mean(no_ceiling, 'tps_within_slo'):,.0f} TPS within SLO. Kept slots give the slot "
        "to the turn that continues the session that just ran, so few sessions run at once "
        f"({mean(slots, 'sessions_running'):.0f}) and their histories stay where they are "
        f"({mean(slots, 'history_found'):.0%} found): the cap then bounds sessions, and the "
        "wait falls on sessions not yet running, which have nothing cached to lose.",
    ]


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--jobs", type=int, default=1, help="simulations in parallel (processes)")
    ap.add_argument("--report-only", action="store_true",
                    help="render from cached runs only; fail if one is missing")  # fmt: skip
    args = ap.parse_args(argv)
    todo = list(dict.fromkeys(keys() + size_keys()))
    missing = [k for k in todo if cached(*k) is None]
    if args.report_only and missing:
        raise SystemExit(f"--report-only: {len(missing)} runs not cached, e.g. {missing[0]}")
    if args.jobs > 1 and len(missing) > 1:
        rc.fork_map(_run, missing, args.jobs, ((seed, 0.0) for *_, seed in missing))
    rows = {k: run(*k) for k in todo}
    wall = sum(r["wall_s"] for r in rows.values()) / 60
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
        f"(5 s); kept slots wait {GRACE_S:g} s for their claim. A request that waited "
        f"{TIMEOUT_S:g} s at the router is refused (its `--queue-timeout-secs`, a 429): it gets "
        "no first token, counts against the SLO, and its client sends the next turn at once "
        "(bench_serving's multi-turn client moves on after a failed turn); TTFTs are of the "
        "requests placed. Mean [min–max] over the trace seeds; the ratios "
        "per seed, seeds in order.",
        "",
        "## With the full global tier",
        "",
        *report(rows, math.inf),
        "",
        "## Without a global tier",
        "",
        "The same trace and instances with no global tier (a history the instance evicted is "
        "recomputed), at lower rates.",
        "",
        *report(rows, 0.0),
        "",
        *reading(rows),
        "",
        "## How large a cap, with kept slots",
        "",
        *sizes(rows),
    ]
    out = rc.RESULTS / "session-slots.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
