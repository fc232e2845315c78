"""The paper's workload characterization (§3) of a trace.

Definitions (block granularity, an infinite store, requests replayed in arrival order):
- reuse ratio: prompt tokens in blocks some earlier request already held (a prefix cache: lookup
  stops at the first block never seen), over all prompt tokens. A full block counts `block_size`
  tokens, the partial last block its own length.
- the reuse split, by the session that *originally produced* the block (§3: "for each reuse we
  track which session originally produced the reused tokens"): *intra-session* when it is the
  request's own session; otherwise *system prompt* when the block is a template block, i.e. one a
  session's first request (turn 0) reused from another session (a fresh session can only share the
  prompt template, and every later turn re-sends it), else *other inter-session* (e.g. a forked
  agent re-using its parent's context).
- reuse interval: for each reused block, the time since the last earlier request holding it
  (arrival to arrival: traces do not record completion times); the share of reused blocks within
  10 s, 100 s and 1 h.
- trigger mix: share of requests per `trigger` ("unknown" where the trace has none).
- requests per minute per instance: requests in each full 1-minute window from the first arrival,
  over the instance count; mean and min over windows (a trailing partial window is left out).
- session shape: requests per session, share of requests that are first requests (turn 0) and
  that start a chain (no parent: first requests and forked sub-agents), share of sessions with one
  request, turns per session (its last turn + 1, median / p90), and the share of prompt tokens in
  blocks held by >= SHARED_BY sessions (shared templates).
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
SHARED_BY = 20  # "template" tokens: blocks held by this many sessions or more


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
    requests_per_session: float
    first_request_share: float  # turn 0: requests that open a session
    chain_start_share: float  # requests with no parent (first requests and forked sub-agents)
    one_request_session_share: float  # of sessions
    shared_ge20_token_share: float  # of prompt tokens, blocks held by >= SHARED_BY sessions
    turns_median: float  # per session: its last turn + 1 (turns before the window count)
    turns_p90: float

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def compute_stats(
    reqs: Sequence[TraceRequest], instances: int = 32, from_s: float = 0.0
) -> TraceStats:
    """Characterize `reqs` (in arrival order, as the loaders return them). Requests arriving
    before `from_s` (a generated trace's lead-in) only fill the store: the statistics are those
    of the later ones against a warm store."""
    if not reqs:
        raise ValueError("empty trace")
    k0 = next((k for k, r in enumerate(reqs) if r.arrival_s >= from_s), len(reqs))
    if k0 == len(reqs):
        raise ValueError(f"no request arrives at or after {from_s:g} s")
    lens = np.fromiter((len(r.block_ids) for r in reqs), dtype=np.int64, count=len(reqs))
    flat = np.concatenate([np.asarray(r.block_ids, dtype=np.int64) for r in reqs])
    dense = _dense_ids(flat)
    sess_names = {s: i for i, s in enumerate(dict.fromkeys(r.session for r in reqs))}
    sess = np.array([sess_names[r.session] for r in reqs], dtype=np.int64)
    nblocks = int(dense.max(initial=-1)) + 1
    last_use = np.full(nblocks, np.nan)
    origin = np.full(nblocks, -1, dtype=np.int64)  # the session that first held the block
    template = np.zeros(nblocks, dtype=bool)  # reused across sessions by a session's first request
    # Per measured request: intra, system, other, prompt tokens, reused blocks, then the counts
    # of reused blocks within each of INTERVALS_S.
    acc = np.zeros(5 + len(INTERVALS_S), dtype=np.int64)
    limits = np.asarray(INTERVALS_S)
    pos = 0
    for k, r in enumerate(reqs):
        n = len(r.block_ids)
        idx = dense[pos : pos + n]
        pos += n
        seen = ~np.isnan(last_use[idx])
        hit = n if seen.all() else int(np.argmin(seen))
        ids = idx[:hit]
        own = origin[ids] == sess[k]
        if r.turn == 0:
            template[ids[~own]] = True
        if k >= k0:  # before k0 (lead-in) a request only fills the store
            tok = np.full(hit, r.block_size, dtype=np.int64)
            if hit and hit == n:
                tok[-1] = _last_block_tokens(r)
            sys_mask = ~own & template[ids]
            acc[0] += tok[own].sum()
            acc[1] += tok[sys_mask].sum()
            acc[2] += tok[~own & ~sys_mask].sum()
            acc[3] += r.input_len
            acc[4] += hit
            gaps = r.arrival_s - last_use[ids]
            acc[5:] += np.count_nonzero(gaps[:, None] <= limits[None, :], axis=0)
        last_use[idx] = r.arrival_s
        fresh = idx[hit:]
        origin[fresh[origin[fresh] < 0]] = sess[k]
    intra, system, other, total, reused_blocks = (int(x) for x in acc[:5])
    within = acc[5:]
    reused = intra + system + other
    off = int(lens[:k0].sum())
    lens, dense, sess, reqs = lens[k0:], dense[off:], sess[k0:], reqs[k0:]
    _, sess = np.unique(sess, return_inverse=True)  # the measured requests' sessions, dense
    per_session = np.bincount(sess)
    turns = np.zeros(len(per_session), dtype=np.int64)
    np.maximum.at(turns, sess, np.array([r.turn + 1 for r in reqs], dtype=np.int64))
    return TraceStats(
        requests=len(reqs),
        sessions=len(per_session),
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
        requests_per_session=len(reqs) / len(per_session),
        first_request_share=sum(r.turn == 0 for r in reqs) / len(reqs),
        chain_start_share=sum(r.parent is None for r in reqs) / len(reqs),
        one_request_session_share=float(np.mean(per_session == 1)),
        shared_ge20_token_share=_shared_share(reqs, lens, dense, sess, SHARED_BY) / max(1, total),
        turns_median=float(np.median(turns)),
        turns_p90=float(np.percentile(turns, 90)),
    )


def _dense_ids(ids: np.ndarray) -> np.ndarray:
    """Block ids renumbered 0..n-1 in their sorted order (np.unique's inverse). Traces number their
    blocks with small non-negative integers, so a presence table over 0..max does it in linear
    time; sorting ~10M ids took seconds."""
    if len(ids) and ids.min() >= 0 and ids.max() < 4 * len(ids):
        present = np.zeros(int(ids.max()) + 1, dtype=bool)
        present[ids] = True
        rank = np.cumsum(present, dtype=np.int64) - 1
        return np.asarray(rank[ids])
    return np.asarray(np.unique(ids, return_inverse=True)[1]).reshape(-1)


def _shared_share(
    reqs: Sequence[TraceRequest],
    lens: np.ndarray,
    dense: np.ndarray,
    sess: np.ndarray,
    k: int,
) -> int:
    """Prompt tokens in blocks that at least `k` distinct sessions hold."""
    starts = np.concatenate(([0], np.cumsum(lens)))
    by_session: dict[int, list[np.ndarray]] = {}
    for i, s in enumerate(sess.tolist()):
        by_session.setdefault(s, []).append(dense[starts[i] : starts[i + 1]])
    # Each session counts once per block it holds: a session's follow-ups repeat its blocks, so
    # the distinct blocks of one session are few next to all of its requests' blocks.
    holders = np.zeros(int(dense.max(initial=-1)) + 1, dtype=np.int64)
    for parts in by_session.values():
        holders[np.unique(np.concatenate(parts))] += 1
    tok = np.full(len(dense), reqs[0].block_size, dtype=np.int64)
    ends = np.cumsum(lens) - 1
    has = lens > 0
    tok[ends[has]] = [_last_block_tokens(r) for r in reqs if r.block_ids]
    return int(tok[holders[dense] >= k].sum())


def _last_block_tokens(r: TraceRequest) -> int:
    """Tokens in a request's last (possibly partial) block."""
    return r.input_len - (len(r.block_ids) - 1) * r.block_size


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


# The paper's §3 numbers (../shared/reference/paper-numbers.md), Trace 1 / Trace 2; "" where §3
# gives none.
PAPER: dict[str, str] = {
    "reuse ratio": "> 80 % (chat 54-62 %)",
    "  intra-session (of reuse)": "~67 %",
    "  system prompt (of reuse)": "18 % / 20 %",
    "  other inter-session (of reuse)": "~15 % (the rest)",
    "reuse within 10s": "often a few s",
    "reuse within 100s": "~90 %",
    "reuse within 3600s": "tail to hours",
    "requests/min/instance mean / min": "43 / >= 30; 48 / >= 30",
    "token share of top 3 % sessions": "few sessions, most tokens",
    "first requests (turn 0)": "a small fraction",
    "trigger agent": "mostly agent",
    "trigger user": "some",
    "trigger compaction": "some",
}


def _rows(st: TraceStats) -> dict[str, str]:
    rows = {
        "requests": f"{st.requests}",
        "sessions": f"{st.sessions}",
        "span": f"{st.span_s:.0f} s",
        "input tokens (mean / max)": f"{st.mean_input_tokens:.0f} / {st.max_input_tokens}",
        "reuse ratio": f"{st.reuse_ratio:.1%}",
        "  intra-session (of reuse)": f"{st.intra_session_share:.1%}",
        "  system prompt (of reuse)": f"{st.system_prompt_share:.1%}",
        "  other inter-session (of reuse)": f"{st.other_inter_share:.1%}",
        **{f"reuse within {k}": f"{v:.1%}" for k, v in st.reuse_within.items()},
        **{f"trigger {k}": f"{st.trigger_mix.get(k, 0.0):.1%}" for k in _TRIGGERS},
        "requests/min/instance mean / min": (
            f"{st.rpm_per_instance_mean:.1f} / {st.rpm_per_instance_min:.1f} ({st.instances})"
        ),
        "token share of top 3 % sessions": f"{st.top3pct_token_share:.1%}",
        "requests per session": f"{st.requests_per_session:.1f}",
        "first requests (turn 0)": f"{st.first_request_share:.1%}",
        "chain starts (first + forked)": f"{st.chain_start_share:.1%}",
        "sessions with one request": f"{st.one_request_session_share:.1%}",
        f"prompt tokens shared by >= {SHARED_BY} sessions": f"{st.shared_ge20_token_share:.1%}",
        "turns per session median / p90": f"{st.turns_median:.0f} / {st.turns_p90:.0f}",
    }
    if "unknown" in st.trigger_mix:
        rows = {k: ("no triggers" if k.startswith("trigger") else v) for k, v in rows.items()}
    return rows


_TRIGGERS = ("agent", "user", "compaction")


def format_table(
    st: TraceStats, compare: TraceStats | None = None, compare_name: str = "compare"
) -> str:
    """A table: this trace, `compare` (when given) and the paper's §3 numbers, one row each."""
    mine = _rows(st)
    other = _rows(compare) if compare is not None else {}
    head = ["statistic", "this trace", *([compare_name] if compare else []), "paper §3"]
    body = [
        [k, v, *([other.get(k, "")] if compare else []), PAPER.get(k, "")] for k, v in mine.items()
    ]
    table = [head, *body]
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table
    )
