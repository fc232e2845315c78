"""One result row of the simulator's JSON from a run (the issue's schema and definitions).

- tps: (input + output tokens) of finished requests / the span from the first arrival to the last
  finish (PD colocation counts prefill and decode tokens); tps_within_slo: the same numerator
  restricted to requests meeting both SLOs.
- ttft_*: seconds; tpot_*: milliseconds, (finish - first token) / (output tokens - 1), over
  requests with at least two output tokens. Requests the engine dropped (could never fit) and
  those the router's admission refused (its queue timeout) have neither and never meet the SLO;
  `refused` counts the latter.
- reuse / local_hit / global_hit ratios: cached prompt tokens (any tier / GPU + host / global)
  over the prompt tokens of the requests placed.
- imbalance_mean: over windows of SimConfig.window_s with any load, from the first window up to
  the one holding the last arrival, max / mean of the tokens each instance computed (prefill
  computed + decode). The drain after the last arrival is left out: there a replay of a trace's
  first N requests empties and a few instances finish the last long requests, which says how the
  replay ends, not how the policy spreads load.
- followup_stickiness: follow-ups (turn > 0) served by the instance their session's first request
  went to, over follow-ups whose session's first request is in the trace.
- tier_mode: SimConfig.tier_mode. window_s / windows: one entry per window of window_s from the
  first arrival to the last step, each the tokens every instance computed in it (prefill computed
  + decode), integers whose sum per instance is exactly its total (largest-remainder rounding);
  the drain after the last arrival is included (figures of load over time read it).
- global_fetch_bytes / global_write_bytes: KV bytes read from / written through to the global
  tier (whole pages: the network and the local-memory parts). link_busy_share: mean over servers
  of the share of the span (first arrival to last finish) its link was busy (sim/tiers.py).

PD rows (--pd) keep this schema with PD meanings and add mode / prefill_tps /
prefill_tps_within_slo: see sim/pd.py summarize_pd.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from smetric_router.sim.cluster import RequestRecord, RunResult
from smetric_router.sim.config import Slo


def tpot_ms(r: RequestRecord) -> float | None:
    """A served request's TPOT (ms); None for one with a single output token or no first token."""
    if r.first_token < 0 or r.output_len <= 1:
        return None
    return (r.finish - r.first_token) / (r.output_len - 1) * 1e3


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def last_arrival_window(recs: Sequence[RequestRecord], window_s: float) -> int:
    return int(max((r.arrival for r in recs), default=0.0) // window_s)


def window_imbalance(windows: Sequence[Sequence[float]], last: int, group: int = 1) -> list[float]:
    """max/mean instance load of each run of `group` windows up to window `last`, skipping
    runs with no load."""
    out = []
    for i in range(0, min(len(windows), last + 1), group):
        load = [sum(col) for col in zip(*windows[i : i + group], strict=True)]
        total = sum(load)
        if total > 0:
            out.append(max(load) / (total / len(load)))
    return out


def imbalance_mean(
    windows: Sequence[Sequence[float]], recs: Sequence[RequestRecord], window_s: float
) -> float:
    """Mean max/mean over the windows with any load, up to the one holding the last arrival."""
    ratios = window_imbalance(windows, last_arrival_window(recs, window_s))
    return float(np.mean(ratios)) if ratios else float("nan")


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the prompt tokens came from and whether follow-ups stayed (both modes' rows)."""

    reuse_ratio: float
    local_hit_ratio: float
    global_hit_ratio: float
    followup_stickiness: float


def placement(recs: Sequence[RequestRecord]) -> Placement:
    recs = [r for r in recs if not r.refused]  # the router's admission never placed them
    prompt = sum(r.input_len for r in recs)
    local = sum(r.cached_local for r in recs)
    glob = sum(r.cached_global for r in recs)
    followups = [r for r in recs if r.turn > 0 and r.first_instance >= 0]
    sticky = sum(r.instance == r.first_instance for r in followups)
    return Placement(
        reuse_ratio=(local + glob) / prompt if prompt else 0.0,
        local_hit_ratio=local / prompt if prompt else 0.0,
        global_hit_ratio=glob / prompt if prompt else 0.0,
        followup_stickiness=sticky / len(followups) if followups else float("nan"),
    )


def window_series(windows: Sequence[Sequence[float]]) -> list[list[int]]:
    """The per-window tokens as integers, each instance's column rounded so that it still sums
    to its total (rounded): largest remainders get the leftover units."""
    if not windows:
        return []
    out = [[int(v) for v in row] for row in windows]
    for col in range(len(windows[0])):
        values = [row[col] for row in windows]
        left = round(sum(values)) - sum(row[col] for row in out)
        if left > 0:
            by_rest = sorted(range(len(values)), key=lambda k: values[k] - int(values[k]))
            for k in by_rest[-left:]:
                out[k][col] += 1
    return out


class TierRun(Protocol):
    """What tier_fields reads of a run: the colocated RunResult and PD's PdRunResult."""

    @property
    def tier_mode(self) -> str: ...
    @property
    def window_tokens(self) -> list[list[float]]: ...
    @property
    def window_s(self) -> float: ...
    @property
    def link_busy_s(self) -> tuple[float, ...]: ...
    @property
    def global_fetch_bytes(self) -> float: ...
    @property
    def global_write_bytes(self) -> float: ...


def tier_fields(run: TierRun, span: float) -> dict[str, Any]:
    """The tier and per-window fields every row carries (colocated and PD); span: the seconds
    link_busy_share is a share of."""
    busy = [min(b / span, 1.0) for b in run.link_busy_s] if span > 0 else []
    return {
        "tier_mode": run.tier_mode,
        "global_fetch_bytes": run.global_fetch_bytes,
        "global_write_bytes": run.global_write_bytes,
        "link_busy_share": sum(busy) / len(busy) if busy else 0.0,
        "window_s": run.window_s,
        "windows": window_series(run.window_tokens),
    }


def summarize(
    run: RunResult, slo: Slo, policy: str, rate_scale: float, global_ratio: float
) -> dict[str, Any]:
    recs = run.records
    ttft: list[float] = []
    tpot: list[float] = []
    tokens = good = 0
    end = 0.0
    for r in recs:
        if r.first_token < 0:
            continue
        end = max(end, r.finish)
        n = r.input_len + r.output_len
        tokens += n
        t_first = r.first_token - r.arrival
        ttft.append(t_first)
        ok = t_first <= slo.ttft_limit(r.input_len)
        per = tpot_ms(r)
        if per is not None:
            tpot.append(per)
            ok = ok and per <= slo.tpot_ms
        good += n if ok else 0
    start = min((r.arrival for r in recs), default=0.0)
    span = end - start
    where = placement(recs)
    return {
        "policy": policy,
        "rate_scale": rate_scale,
        "global_ratio": global_ratio,
        "tps": tokens / span if span > 0 else 0.0,
        "tps_within_slo": good / span if span > 0 else 0.0,
        "ttft_p50": percentile(ttft, 50),
        "ttft_p90": percentile(ttft, 90),
        "ttft_p99": percentile(ttft, 99),
        "tpot_p50": percentile(tpot, 50),
        "tpot_p90": percentile(tpot, 90),
        "tpot_p99": percentile(tpot, 99),
        "reuse_ratio": where.reuse_ratio,
        "local_hit_ratio": where.local_hit_ratio,
        "global_hit_ratio": where.global_hit_ratio,
        "imbalance_mean": imbalance_mean(run.window_tokens, recs, run.window_s),
        "followup_stickiness": where.followup_stickiness,
        "refused": sum(r.refused for r in recs),
        **tier_fields(run, span),
    }
