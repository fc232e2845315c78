"""What one admission-benchmark run's records add up to, in model time.

The client records wall seconds; emulated workers run `speedup` model seconds per wall second,
so a model duration is the wall duration times the speedup. A turn's TTFT is counted from its
first attempt: the time the agent waited, a 429's Retry-After pause and the retry included.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from benchmarks.admission_load import Attempt, Records


def pct(xs: Sequence[float], q: float) -> float:
    """The q-th percentile (nearest rank); NaN for no values."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = min(len(s) - 1, max(0, round(q / 100 * len(s) + 0.5) - 1))
    return s[k]


@dataclass(frozen=True, slots=True)
class RunStats:
    router: str
    load: float  # offered load, times capacity
    duration_s: float  # model seconds of the run (arrivals and drain)
    goodput: float  # requests answered with TTFT in SLO per model second
    ok: int
    in_slo: int
    shed: int  # refusals: 429s, and 503s from a queue
    shed_429_with_retry_after: int  # the clear kind: a 429 that says when to come back
    shed_reasons: dict[str, int]
    lost: int  # admitted (or at least not refused) requests that did not complete
    unfinished: int  # requests cut by the run's end
    sessions: int
    completed: int
    abandoned: int
    failed: int
    session_p50_s: float
    session_p90_s: float
    first_ttft_p50_s: float
    first_ttft_p90_s: float
    follow_ttft_p50_s: float
    follow_ttft_p90_s: float
    ttft_p50_s: float
    wait_ms_p50: float  # smetric-router's x-smetric-admission-wait-ms of admitted requests
    tenants: dict[str, dict[str, float]] = field(default_factory=dict)
    lost_examples: tuple[str, ...] = ()


def turn_ttft(a: Attempt) -> float:
    """The turn's TTFT as the agent saw it, from its first attempt (wall seconds)."""
    assert a.ttft_s is not None
    return a.start_s + a.ttft_s - a.turn_start_s


def stats(router: str, load: float, rec: Records, run_s: float, speedup: float,
          slo_ttft_s: float) -> RunStats:  # fmt: skip
    """slo_ttft_s: model seconds; run_s: wall seconds the run lasted."""
    ok = [a for a in rec.attempts if a.outcome == "ok" and a.ttft_s is not None]
    good = [a for a in ok if turn_ttft(a) * speedup <= slo_ttft_s]
    shed = [a for a in rec.attempts if a.outcome == "shed"]
    lost = [a for a in rec.attempts if a.outcome == "error"]
    first = [turn_ttft(a) * speedup for a in ok if a.turn == 0]
    follow = [turn_ttft(a) * speedup for a in ok if a.turn > 0]
    done = [s for s in rec.sessions if s.state == "completed"]
    lengths = [(s.end_s - s.start_s) * speedup for s in done]
    waits = [a.admission_wait_ms for a in ok if a.admission_wait_ms is not None]
    model_s = run_s * speedup
    tenants: dict[str, dict[str, float]] = {}
    names = sorted({s.tenant for s in rec.sessions})
    for t in names:
        tg = sum(a.tenant == t for a in good)
        tenants[t] = {
            "goodput": tg / model_s,
            "share": tg / len(good) if good else 0.0,
            "ok": sum(a.tenant == t for a in ok),
            "shed": sum(a.tenant == t for a in shed),
            "sessions": sum(s.tenant == t for s in rec.sessions),
            "completed": sum(s.tenant == t for s in done),
            "first_ttft_p90_s": pct(
                [turn_ttft(a) * speedup for a in ok if a.tenant == t and a.turn == 0], 90
            ),
        }
    states = Counter(s.state for s in rec.sessions)
    clear = sum(a.status == 429 and a.retry_after_s is not None for a in shed)
    return RunStats(
        router=router,
        load=load,
        duration_s=model_s,
        goodput=len(good) / model_s,
        ok=len(ok),
        in_slo=len(good),
        shed=len(shed),
        shed_429_with_retry_after=clear,
        shed_reasons=dict(Counter(f"{a.status} {a.shed_reason or 'unsaid'}" for a in shed)),
        lost=len(lost),
        unfinished=sum(a.outcome == "unfinished" for a in rec.attempts),
        sessions=len(rec.sessions),
        completed=len(done),
        abandoned=states["abandoned"],
        failed=states["failed"],
        session_p50_s=pct(lengths, 50),
        session_p90_s=pct(lengths, 90),
        first_ttft_p50_s=pct(first, 50),
        first_ttft_p90_s=pct(first, 90),
        follow_ttft_p50_s=pct(follow, 50),
        follow_ttft_p90_s=pct(follow, 90),
        ttft_p50_s=pct([turn_ttft(a) * speedup for a in ok], 50),
        wait_ms_p50=pct(waits, 50),
        tenants=tenants,
        lost_examples=tuple(f"{a.status} {a.detail}" for a in lost[:5]),
    )


def capacity_of(rec: Records, window_s: float, turns: int) -> tuple[float, float, float]:
    """From a closed-loop calibration: (sessions per wall second, requests per wall second, mean
    request time in wall seconds) of the requests that completed inside the window."""
    ok = [a for a in rec.attempts if a.outcome == "ok" and a.end_s <= window_s]
    req_s = len(ok) / window_s
    mean = sum(a.end_s - a.start_s for a in ok) / len(ok) if ok else float("nan")
    return req_s / turns, req_s, mean
