"""The simulator's outputs: the JSON document, a table for people, and plots."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


def max_tps_within_slo(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Per policy, the best TPS within SLO over every row of it (the rate sweep; with a sweep of
    global ratios too, the best over those as well: per-ratio maxima are in the rows)."""
    best: dict[str, float] = {}
    for r in rows:
        best[r["policy"]] = max(best.get(r["policy"], 0.0), r["tps_within_slo"])
    return best


@dataclass(frozen=True, slots=True)
class Spread:
    """Mean and range of one number over trace seeds."""

    values: tuple[float, ...]

    @property
    def mean(self) -> float:
        return float(np.mean(self.values))

    @property
    def lo(self) -> float:
        return float(min(self.values))

    @property
    def hi(self) -> float:
        return float(max(self.values))

    def fmt(self, spec: str = ".3f", scale: float = 1.0, unit: str = "") -> str:
        if any(math.isnan(v) for v in self.values):
            return "—"  # undefined on some seed (e.g. no follow-up of a session begun in it)
        m = format(self.mean * scale, spec)
        if len(self.values) < 2:
            return m + unit
        return f"{m}{unit} [{format(self.lo * scale, spec)}–{format(self.hi * scale, spec)}]"

    def pct(self) -> str:
        return self.fmt(".1f", 100, " %")


def spread(values: Iterable[float | None]) -> Spread:
    vals = tuple(math.nan if v is None else float(v) for v in values)  # JSON null = NaN
    if not vals:
        raise ValueError("no values")
    return Spread(vals)


def _json_value(v: Any) -> Any:
    # JSON has no inf/nan: a fully provisioned tier is "inf", an undefined metric null
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def document(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {
        "results": [{k: _json_value(v) for k, v in r.items()} for r in rows],
        "max_tps_within_slo": max_tps_within_slo(rows),
    }


_COLUMNS = (
    ("policy", "policy", "{}"),
    ("rate", "rate_scale", "{:g}"),
    ("global", "global_ratio", "{:g}"),
    ("TPS", "tps", "{:.0f}"),
    ("TPS@SLO", "tps_within_slo", "{:.0f}"),
    ("TTFT p50/p90/p99 s", ("ttft_p50", "ttft_p90", "ttft_p99"), "{:.2f}"),
    ("TPOT p50/p90/p99 ms", ("tpot_p50", "tpot_p90", "tpot_p99"), "{:.1f}"),
    ("reuse", "reuse_ratio", "{:.1%}"),
    ("local", "local_hit_ratio", "{:.1%}"),
    ("global", "global_hit_ratio", "{:.1%}"),
    ("imbal", "imbalance_mean", "{:.2f}"),
    ("sticky", "followup_stickiness", "{:.1%}"),
)


def table(rows: Sequence[dict[str, Any]]) -> str:
    cells = [[title for title, _, _ in _COLUMNS]]
    for r in rows:
        line = []
        for _, key, fmt in _COLUMNS:
            keys = key if isinstance(key, tuple) else (key,)
            line.append("/".join(fmt.format(r[k]) for k in keys))
        cells.append(line)
    widths = [max(len(c[i]) for c in cells) for i in range(len(_COLUMNS))]
    out = [
        "  ".join(
            c.rjust(w) if i else c.ljust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in cells
    ]
    best = max_tps_within_slo(rows)
    out.append("")
    out.append("max TPS within SLO: " + ", ".join(f"{p} {v:.0f}" for p, v in best.items()))
    return "\n".join(out)


def plots(rows: Sequence[dict[str, Any]], directory: Path) -> list[Path]:
    """tps_within_slo vs rate scale per global ratio, and the reuse split per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    ratios = sorted({r["global_ratio"] for r in rows})
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    for ratio in ratios:
        fig, ax = plt.subplots(figsize=(6, 4))
        for p in policies:
            pts = sorted(
                (r["rate_scale"], r["tps_within_slo"])
                for r in rows
                if r["policy"] == p and r["global_ratio"] == ratio
            )
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=p)
        ax.set_xlabel("rate scale")
        ax.set_ylabel("TPS within SLO (tokens/s)")
        ax.set_title(f"global/local capacity {'inf' if math.isinf(ratio) else f'{ratio:g}'}")
        ax.legend()
        fig.tight_layout()
        path = directory / f"tps_within_slo_global_{ratio:g}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(rows)), 4))
    labels = [f"{r['policy']}\n{r['rate_scale']:g}x g{r['global_ratio']:g}" for r in rows]
    local = [r["local_hit_ratio"] for r in rows]
    glob = [r["global_hit_ratio"] for r in rows]
    ax.bar(labels, local, label="local tier")
    ax.bar(labels, glob, bottom=local, label="global tier")
    ax.set_ylabel("share of prompt tokens reused")
    ax.legend()
    fig.tight_layout()
    path = directory / "reuse_split.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)
    return written
