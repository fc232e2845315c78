"""How long the emulated model's answers are when nothing forces their length.

A real model stops at its end-of-turn token; the emulator draws that natural length from the output
lengths of a production trace, kept as a quantile table in `assets/output_lengths.json` (the trace
itself does not ship). Remake the table from a Mooncake-format trace (one JSON object per line with
`output_length`):

    python -m smetric_router.emulator.output_lengths ../shared/traces/mooncake-conversation.jsonl
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path

TABLE = Path(__file__).resolve().parent.parent / "assets" / "output_lengths.json"
POINTS = 100  # quantiles at 0, 1/POINTS, ..., 1


@functools.cache
def quantiles() -> tuple[int, ...]:
    data = json.loads(TABLE.read_text())
    q = tuple(int(v) for v in data["quantiles"])
    assert len(q) == POINTS + 1 and all(a <= b for a, b in itertools.pairwise(q))
    return q


def natural_length(seed: int) -> int:
    """A length in tokens (end of turn included, at least 1), the same for the same seed: the
    table's inverse CDF at a point drawn from the seed, linear between quantiles."""
    q = quantiles()
    u = (seed % (1 << 53)) / (1 << 53) * POINTS
    i = min(int(u), POINTS - 1)
    value = q[i] + (q[i + 1] - q[i]) * (u - i)
    return max(1, round(value))


def table(lengths: Sequence[int]) -> list[int]:
    """Quantiles by the nearest rank, at 0, 1/POINTS, ..., 1."""
    s = sorted(lengths)
    n = len(s)
    return [s[min(n - 1, max(0, math.ceil(k / POINTS * n) - 1))] for k in range(POINTS + 1)]


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m smetric_router.emulator.output_lengths")
    p.add_argument("trace", type=Path, help="Mooncake-format JSONL with output_length")
    p.add_argument("--out", type=Path, default=TABLE)
    args = p.parse_args(argv)
    with args.trace.open() as f:
        lengths = [int(json.loads(line)["output_length"]) for line in f if line.strip()]
    out = {
        "source": f"{args.trace.name}: output_length of {len(lengths)} requests",
        "made_by": "python -m smetric_router.emulator.output_lengths",
        "points": POINTS,
        "quantiles": table(lengths),
    }
    text = json.dumps(out, indent=1)  # the table on one line: 101 numbers
    args.out.write_text(re.sub(r"\[\s+([^\]]*?)\s+\]", _one_line, text) + "\n")


def _one_line(m: re.Match[str]) -> str:
    return "[" + " ".join(m.group(1).split()) + "]"


if __name__ == "__main__":
    main()
