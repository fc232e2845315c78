"""The goodput of stored benchmarks.compare runs under other SLOs, without running them again.

    python -m benchmarks.slo_rescore /tmp/smetric-compare/TAG --ttft-ms 8000 --tpot-ms 400,120 \
        --out benchmarks/results/TAG-tpot.md

benchmarks.compare keeps each run's bench_serving output (`--output-details`: every request's
TTFT, inter-token latencies and output length) beside a sidecar naming its router, rate and
draw. Goodput is recomputed from them as bench_serving computes it: the requests with TTFT and
TPOT ((end - first token) / (output tokens - 1), here the sum of the request's inter-token
latencies over output tokens - 1) both within the SLO, over the run's duration. What this is
for: a comparison whose ranking turns on an SLO the run did not use, e.g. the simulator's 30-ms
TPOT against the emulated runs' looser one (at --speedup 0.25 a modelled 30 ms is 120 ms of
wall time).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from smetric_router.sim.report import spread


@dataclass(frozen=True, slots=True)
class Scored:
    router: str
    rate: float
    draw: int
    goodput: float  # requests within both SLOs per second
    tpot_ok: float  # the share of requests whose TPOT is within its SLO


def score(result: dict[str, object], ttft_ms: float, tpot_ms: float) -> tuple[float, float]:
    """(goodput, share within the TPOT SLO) of one bench_serving result with --output-details.
    A failed request (an error, or no first token) meets neither SLO."""
    ttfts, itls = result["ttfts"], result["itls"]
    outs, errors = result["output_lens"], result["errors"]
    assert isinstance(ttfts, list) and isinstance(itls, list)
    assert isinstance(outs, list) and isinstance(errors, list)
    good = tpot_good = 0
    for ttft, gaps, out, err in zip(ttfts, itls, outs, errors, strict=True):
        if err or not ttft:
            continue
        tpot = sum(gaps) / (out - 1) * 1e3 if out > 1 else 0.0
        tpot_good += tpot <= tpot_ms
        good += ttft * 1e3 <= ttft_ms and tpot <= tpot_ms
    duration = result["duration"]
    assert isinstance(duration, float | int) and duration > 0
    return good / duration, tpot_good / len(ttfts) if ttfts else 0.0


@dataclass(frozen=True, slots=True)
class Run:
    router: str
    rate: float
    draw: int
    result: dict[str, object]  # bench_serving's, with --output-details


def load(work: Path) -> list[Run]:
    """Every stored run of the work dir, each read once."""
    out = []
    for side_file in sorted(work.glob("*.run.json")):
        side = json.loads(side_file.read_text())
        bench = side_file.with_name(side_file.name.removesuffix(".run.json") + ".jsonl")
        result = json.loads(bench.read_text().splitlines()[-1])
        out.append(Run(side["router"], side["rate"], side.get("draw", 1), result))
    return out


def table(work: Path, ttft_ms: float, tpots: Sequence[float]) -> list[str]:
    """Per router and rate, mean [min-max] over draws of the goodput under each TPOT SLO."""
    cells: dict[tuple[str, float], dict[float, list[Scored]]] = defaultdict(dict)
    for run in load(work):
        for tpot in tpots:
            goodput, ok = score(run.result, ttft_ms, tpot)
            scored = Scored(run.router, run.rate, run.draw, goodput, ok)
            cells[(run.router, run.rate)].setdefault(tpot, []).append(scored)
    if not cells:
        raise SystemExit(f"no benchmarks.compare runs (*.run.json) in {work}")
    head = ["router", "rate (conv/s)", "draws"]
    for tpot in tpots:
        head += [f"goodput, TPOT ≤ {tpot:g} ms (req/s)", f"within TPOT ≤ {tpot:g} ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (router, rate), by in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        row = [router, f"{rate:g}", str(len(by[tpots[0]]))]
        for tpot in tpots:
            row += [
                spread(s.goodput for s in by[tpot]).fmt(".2f"),
                spread(s.tpot_ok for s in by[tpot]).pct(),
            ]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument(
        "work", type=Path, help="a benchmarks.compare work dir (/tmp/smetric-compare/TAG)"
    )
    ap.add_argument("--ttft-ms", type=float, required=True, help="TTFT SLO, ms")
    ap.add_argument("--tpot-ms", required=True, help="comma-separated TPOT SLOs, ms")
    ap.add_argument("--out", type=Path, help="write the table here (Markdown); default: print it")
    args = ap.parse_args(argv)
    tpots = [float(x) for x in args.tpot_ms.split(",")]
    lines = table(args.work, args.ttft_ms, tpots)
    text = "\n".join(lines) + "\n"
    if args.out is None:
        print(text, end="")
        return
    args.out.write_text(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
