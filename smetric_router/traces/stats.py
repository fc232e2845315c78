"""The paper's workload characterization (§3) of a trace.

Definitions (block granularity, an infinite store, requests replayed in arrival order):
- reuse ratio: prompt tokens in blocks some earlier request already held (a prefix cache: lookup
  stops at the first block never seen), over all prompt tokens. A full block counts `block_size`
  tokens, the partial last block its own length.
- the reuse split: a reused block is *intra-session* when an earlier request of the same session
  held it (follow-ups re-sending their history); otherwise it is *system prompt* reuse when the
  request is its session's first (turn 0: a fresh session can only share the prompt template) and
  *other inter-session* reuse for a later turn (e.g. a forked agent's start from its parent's
  context).
- reuse interval: for each reused block, the time since the last earlier request holding it
  (arrival to arrival: traces do not record completion times); the share of reused blocks within
  10 s, 100 s and 1 h.
- trigger mix: share of requests per `trigger` ("unknown" where the trace has none).
- requests per minute per instance: requests in each full 1-minute window from the first arrival,
  over the instance count; mean and min over windows (a trailing partial window is left out).
- top-3 % token share: share of all tokens (prompt + output) in the 3 % of sessions (rounded up)
  with the most tokens.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from smetric_router.traces.schema import TraceRequest

INTERVALS_S: tuple[float, ...] = (10.0, 100.0, 3600.0)


@dataclass(frozen=True, slots=True)
class TraceStats:
    requests: int
    sessions: int
    span_s: float
    prompt_tokens: int
    reuse_ratio: float
    intra_session_share: float  # of reused tokens
    system_prompt_share: float
    other_inter_share: float
    reuse_within: dict[str, float]  # "10s" / "100s" / "3600s" -> share of reused blocks
    trigger_mix: dict[str, float]
    instances: int
    rpm_per_instance_mean: float
    rpm_per_instance_min: float
    top3pct_token_share: float
    mean_input_tokens: float
    max_input_tokens: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def compute_stats(reqs: Sequence[TraceRequest], instances: int = 32) -> TraceStats:
    """Characterize `reqs` (in arrival order, as the loaders return them)."""
    if not reqs:
        raise ValueError("empty trace")
    flat = np.fromiter(
        (b for r in reqs for b in r.block_ids),
        dtype=np.int64,
        count=sum(len(r.block_ids) for r in reqs),
    )
    _, dense = np.unique(flat, return_inverse=True)
    last_use = np.full(int(dense.max(initial=-1)) + 1, np.nan)
    session_held: dict[str, set[int]] = {}
    intra = system = other = total = 0
    reused_blocks = 0
    within = np.zeros(len(INTERVALS_S), dtype=np.int64)
    pos = 0
    for r in reqs:
        n = len(r.block_ids)
        idx = dense[pos : pos + n]
        pos += n
        sizes = _block_tokens(r)
        total += r.input_len
        seen = ~np.isnan(last_use[idx])
        hit = n if seen.all() else int(np.argmin(seen))
        held = session_held.setdefault(r.session, set())
        own = _held_prefix(idx, hit, held)
        intra += _tokens(sizes, 0, own, r.block_size)
        inter = _tokens(sizes, own, hit, r.block_size)
        if r.turn == 0:
            system += inter
        else:
            other += inter
        if hit:
            gaps = r.arrival_s - last_use[idx[:hit]]
            within += np.count_nonzero(gaps[:, None] <= np.asarray(INTERVALS_S)[None, :], axis=0)
            reused_blocks += hit
        last_use[idx] = r.arrival_s
        held.update(idx[own:].tolist())
    reused = intra + system + other
    return TraceStats(
        requests=len(reqs),
        sessions=len(session_held),
        span_s=reqs[-1].arrival_s - reqs[0].arrival_s,
        prompt_tokens=total,
        reuse_ratio=reused / max(1, total),
        intra_session_share=intra / max(1, reused),
        system_prompt_share=system / max(1, reused),
        other_inter_share=other / max(1, reused),
        reuse_within={
            f"{s:g}s": float(w) / max(1, reused_blocks)
            for s, w in zip(INTERVALS_S, within, strict=True)
        },
        trigger_mix=_trigger_mix(reqs),
        instances=instances,
        **_rate(reqs, instances),
        top3pct_token_share=_top_share(reqs, 0.03),
        mean_input_tokens=total / len(reqs),
        max_input_tokens=max(r.input_len for r in reqs),
    )


def _block_tokens(r: TraceRequest) -> tuple[int, int]:
    """(number of blocks, tokens in the last block)."""
    n = len(r.block_ids)
    return n, r.input_len - (n - 1) * r.block_size if n else 0


def _tokens(sizes: tuple[int, int], start: int, end: int, bs: int) -> int:
    """Tokens in blocks [start, end) of a prompt of `sizes`."""
    n, last = sizes
    if end <= start:
        return 0
    return (end - start) * bs - (bs - last if end == n else 0)


def _held_prefix(idx: np.ndarray, hit: int, held: set[int]) -> int:
    """Length of the prefix of `idx` the session held: prefix-chained ids make holding monotone,
    so a binary search over the first `hit` blocks finds it."""
    lo, hi = 0, hit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if int(idx[mid - 1]) in held:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _trigger_mix(reqs: Sequence[TraceRequest]) -> dict[str, float]:
    c = Counter(r.trigger or "unknown" for r in reqs)
    return {k: v / len(reqs) for k, v in sorted(c.items())}


def _rate(reqs: Sequence[TraceRequest], instances: int) -> dict[str, float]:
    t0 = reqs[0].arrival_s
    span = reqs[-1].arrival_s - t0
    if span < 60.0:  # shorter than a window: its one partial window, scaled to a minute
        counts = np.array([len(reqs) * 60.0 / max(span, 1.0)])
    else:
        minute = ((np.array([r.arrival_s for r in reqs]) - t0) // 60.0).astype(np.int64)
        counts = np.bincount(minute)[: int(span // 60.0)]
    return {
        "rpm_per_instance_mean": float(counts.mean()) / instances,
        "rpm_per_instance_min": float(counts.min()) / instances,
    }


def _top_share(reqs: Sequence[TraceRequest], frac: float) -> float:
    per = Counter[str]()
    for r in reqs:
        per[r.session] += r.input_len + r.output_len
    vals = sorted(per.values(), reverse=True)
    k = max(1, math.ceil(frac * len(vals)))
    return sum(vals[:k]) / max(1, sum(vals))


def format_table(st: TraceStats) -> str:
    rows = [
        ("requests", f"{st.requests}"),
        ("sessions", f"{st.sessions}"),
        ("span", f"{st.span_s:.0f} s"),
        ("input tokens (mean / max)", f"{st.mean_input_tokens:.0f} / {st.max_input_tokens}"),
        ("reuse ratio", f"{st.reuse_ratio:.1%}"),
        ("  intra-session (of reuse)", f"{st.intra_session_share:.1%}"),
        ("  system prompt (of reuse)", f"{st.system_prompt_share:.1%}"),
        ("  other inter-session (of reuse)", f"{st.other_inter_share:.1%}"),
        *((f"reuse within {k}", f"{v:.1%}") for k, v in st.reuse_within.items()),
        *((f"trigger {k}", f"{v:.1%}") for k, v in st.trigger_mix.items()),
        (
            f"requests/min/instance ({st.instances}) mean / min",
            f"{st.rpm_per_instance_mean:.1f} / {st.rpm_per_instance_min:.1f}",
        ),
        ("token share of top 3 % sessions", f"{st.top3pct_token_share:.1%}"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
