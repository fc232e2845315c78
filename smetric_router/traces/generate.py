"""Agentic trace generator: Bailian-schema JSONL plus a `trigger` field, calibrated to paper §3.

Model. A root session starts with a *user* request: one of a few shared system prompts (agent
frameworks: instructions + tool schemas) followed by the user's task. Then the agent loops: each
*agent* request re-sends the whole history plus the previous reply and a tool result, seconds after
the previous one; when a loop ends the user may send another message minutes later (*user*
request) and a new loop starts. Once the history passes a per-session threshold the next request is
a *compaction*: its prompt is the system prompt plus a fresh summary, so the prefix chain breaks
and later turns extend the summary. A few sessions go idle for about an hour before the user comes
back. Now and then an agent turn forks sub-agents: each is a new session (new chat chain) whose
first request carries a prefix of the parent's context plus a sub-task, with the turn number
continuing the parent's (its messages hold the parent's history, so a router that infers turns from
the request sees a follow-up); the parent resumes when its sub-agents finish. Root sessions start
as a Poisson process over the duration. Hash ids are prefix-chained blocks of `block_size` tokens:
a block's id is shared exactly when its whole prefix is; the last, partial block of a prompt gets
an id of its own. Everything is drawn from one `numpy.random.Generator(seed)`, so a seed fixes the
file byte for byte.

Calibration knobs (`GenConfig`) and the Finding each one targets (DESIGN.md §6):
- Reuse >= 80 % (Finding 3.1): `tool_tokens_*`, `user_tokens_*`, `output_tokens_*` set how much new
  text each turn adds against the history it re-sends; `loop_turns_*` and `user_continue_p` set
  how many turns re-send it.
- Intra-session ~2/3 of reuse (Finding 3.1): the same turn knobs (follow-ups re-sending their own
  history) weighed against the two inter-session sources below.
- System-prompt ~18-20 % of reuse (Finding 3.1): `templates`, `template_zipf`,
  `template_tokens_*` (a handful of shared prompts of ~10K tokens re-used by every first request).
- Other inter-session reuse (~15 %; forked agents, Finding 3.1's note): `fork_p`,
  `fork_children_max`, `fork_prefix_min` (how much of the parent's context a sub-agent re-uses).
- ~90 % of reuse within ~100 s, tail to hours (Finding 3.1, Fig. 6): `agent_gap_*` plus
  `decode_s_per_token` (agent turns seconds apart), `slow_tool_*` (a quarter of tool calls are
  builds or test runs of minutes), `user_gap_*` (minutes), `resume_p` and `resume_gap_*` (an hour
  or more).
- Trigger mix, mostly agent (Fig. 7): `loop_turns_*` against `user_continue_p`; compaction
  requests from `compact_at_tokens` (also bounds contexts at ~100K+ tokens).
- Reuse ratio itself (paper: > 80 %): `task_tokens_*`, the new text each fresh session brings
  (per-project instructions, files, the question).
- Heavy-tailed tokens per session, top 3 % carry a large share (Finding 3.2, Fig. 8): the
  `long_session_p` of long interactive tasks (`long_loop_turns_median`, `long_user_continue_p`)
  among short ones, lognormal `loop_turns_sigma` and geometric user loops (context grows with
  every turn, so a long session's tokens grow quadratically).
- Requests per minute per instance (mean 43 at 32 instances, Finding 3.2): the default duration
  is the request count over `rpm_per_instance * instances`. Sessions live minutes (hours when
  resumed), so the trace holds that rate only when the duration is much longer than a session:
  use ~10K+ sessions (or a longer `--duration-s` for a lighter load) for a steady state.

`--sessions N` counts root sessions; forked sub-agent sessions come on top (~0.3 per root).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson


@dataclass(frozen=True, slots=True)
class GenConfig:
    sessions: int = 2000
    seed: int = 0
    duration_s: float | None = None  # None: set by rpm_per_instance * instances
    block_size: int = 16
    rpm_per_instance: float = 43.0
    instances: int = 32
    templates: int = 5
    template_zipf: float = 1.0
    template_tokens_median: float = 22_000.0
    template_tokens_sigma: float = 0.4
    task_tokens_median: float = 5_000.0
    task_tokens_sigma: float = 1.0
    task_tokens_max: int = 40_000
    loop_turns_median: float = 1.0  # agent turns after each user message, most sessions
    loop_turns_sigma: float = 0.8
    user_continue_p: float = 0.15
    long_session_p: float = 0.03  # long interactive agent tasks
    long_loop_turns_median: float = 4.0
    long_user_continue_p: float = 0.7
    tool_tokens_median: float = 400.0
    tool_tokens_sigma: float = 1.2
    tool_tokens_max: int = 24_000
    user_tokens_median: float = 120.0
    user_tokens_sigma: float = 1.0
    output_tokens_median: float = 120.0
    output_tokens_sigma: float = 0.9
    output_tokens_max: int = 2_000
    decode_s_per_token: float = 0.03
    agent_gap_median_s: float = 3.0
    agent_gap_sigma: float = 0.8
    slow_tool_p: float = 0.25  # tool calls that run minutes (builds, test suites)
    slow_tool_median_s: float = 150.0
    slow_tool_sigma: float = 0.8
    user_gap_median_s: float = 240.0
    user_gap_sigma: float = 1.0
    resume_p: float = 0.03
    resume_gap_median_s: float = 3600.0
    resume_gap_sigma: float = 0.5
    compact_at_tokens: tuple[int, int] = (60_000, 100_000)
    summary_tokens_median: float = 3_000.0
    fork_p: float = 0.2
    fork_children_max: int = 3
    fork_prefix_min: float = 0.5
    subtask_tokens_median: float = 300.0


@dataclass(slots=True)
class _Context:
    """A growing prompt: ids of its full blocks and the token count of its partial last block."""

    ids: list[int]
    tail: int = 0

    def copy(self) -> _Context:
        return _Context(ids=list(self.ids), tail=self.tail)


@dataclass(slots=True)
class _Req:
    time: float
    parent: int  # index of the previous request of the chain in generation order, -1 for a root
    turn: int  # 1-based, as in the public Bailian trace
    input_len: int
    output_len: int
    trigger: str
    epoch: list[int]  # the context's block ids; this request's full blocks are a prefix of it
    n_full: int
    partial: int  # id of the partial last block, -1 when none


class _Gen:
    def __init__(self, cfg: GenConfig) -> None:
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)
        self.next_id = 0
        self.reqs: list[_Req] = []
        self.templates = [
            self.grown(_Context([]), self.template_tokens()) for _ in range(cfg.templates)
        ]
        w = 1.0 / np.arange(1, cfg.templates + 1) ** cfg.template_zipf
        self.template_p = w / w.sum()

    def template_tokens(self) -> int:
        return self.tokens(self.cfg.template_tokens_median, self.cfg.template_tokens_sigma)

    def lognormal(self, median: float, sigma: float) -> float:
        return median * math.exp(sigma * float(self.rng.standard_normal()))

    def tokens(self, median: float, sigma: float, cap: int = 1 << 30) -> int:
        return max(1, min(cap, round(self.lognormal(median, sigma))))

    def new_ids(self, n: int) -> range:
        r = range(self.next_id, self.next_id + n)
        self.next_id += n
        return r

    def grown(self, ctx: _Context, n: int) -> _Context:
        """`ctx` with `n` more tokens (in place): the partial block and new ones get fresh ids."""
        total = ctx.tail + n
        ctx.ids.extend(self.new_ids(total // self.cfg.block_size))
        ctx.tail = total % self.cfg.block_size
        return ctx

    def emit(
        self, t: float, ctx: _Context, parent: int, turn: int, trigger: str
    ) -> tuple[int, int]:
        """Record a request with prompt `ctx`; returns (its index, its output length)."""
        c = self.cfg
        out = self.tokens(c.output_tokens_median, c.output_tokens_sigma, c.output_tokens_max)
        self.reqs.append(
            _Req(
                time=t,
                parent=parent,
                turn=turn,
                input_len=len(ctx.ids) * c.block_size + ctx.tail,
                output_len=out,
                trigger=trigger,
                epoch=ctx.ids,
                n_full=len(ctx.ids),
                partial=self.new_ids(1)[0] if ctx.tail else -1,
            )
        )
        return len(self.reqs) - 1, out

    def root(self, t: float) -> None:
        c = self.cfg
        system = self.templates[int(self.rng.choice(c.templates, p=self.template_p))]
        ctx = self.grown(
            system.copy(), self.tokens(c.task_tokens_median, c.task_tokens_sigma, c.task_tokens_max)
        )
        long = self.rng.random() < c.long_session_p
        loops = int(
            self.rng.geometric(1.0 - (c.long_user_continue_p if long else c.user_continue_p))
        )
        median = c.long_loop_turns_median if long else c.loop_turns_median
        self.session(t, ctx, system, 1, "user", loops, median)

    def session(
        self,
        t: float,
        ctx: _Context,
        system: _Context,
        turn: int,
        trigger: str,
        loops: int,
        loop_median: float,
    ) -> float:
        """One session from its first request at `t`; returns the time of its last request."""
        c = self.cfg
        compact_at = int(self.rng.integers(*c.compact_at_tokens))
        key, out = self.emit(t, ctx, -1, turn, trigger)
        for loop in range(loops):
            if loop:
                gap = self.lognormal(c.user_gap_median_s, c.user_gap_sigma)
                if self.rng.random() < c.resume_p:
                    gap = self.lognormal(c.resume_gap_median_s, c.resume_gap_sigma)
                t += out * c.decode_s_per_token + gap
                self.grown(ctx, out + self.tokens(c.user_tokens_median, c.user_tokens_sigma))
                turn += 1
                key, out = self.emit(t, ctx, key, turn, "user")
            for _ in range(int(self.lognormal(loop_median, c.loop_turns_sigma))):
                t += out * c.decode_s_per_token
                if self.rng.random() < c.slow_tool_p:
                    t += self.lognormal(c.slow_tool_median_s, c.slow_tool_sigma)
                else:
                    t += self.lognormal(c.agent_gap_median_s, c.agent_gap_sigma)
                turn += 1
                if len(ctx.ids) * c.block_size >= compact_at:
                    summary = self.tokens(c.summary_tokens_median, 0.5)
                    ctx = self.grown(system.copy(), summary)
                    key, out = self.emit(t, ctx, key, turn, "compaction")
                    continue
                tool = self.tokens(c.tool_tokens_median, c.tool_tokens_sigma, c.tool_tokens_max)
                self.grown(ctx, out + tool)
                key, out = self.emit(t, ctx, key, turn, "agent")
                if trigger == "user" and self.rng.random() < c.fork_p:
                    t = max(t, self.fork(t + out * c.decode_s_per_token, ctx, system, turn))
        return t

    def fork(self, t: float, parent: _Context, system: _Context, turn: int) -> float:
        """Sub-agents off the parent's context; returns when the last one finishes."""
        c = self.cfg
        end = t
        for _ in range(int(self.rng.integers(1, c.fork_children_max + 1))):
            share = c.fork_prefix_min + (1.0 - c.fork_prefix_min) * float(self.rng.random())
            child = _Context(ids=parent.ids[: max(1, round(len(parent.ids) * share))])
            self.grown(child, self.tokens(c.subtask_tokens_median, 1.0))
            start = t + float(self.rng.uniform(0.1, 1.0))
            end = max(
                end, self.session(start, child, system, turn + 1, "agent", 1, c.loop_turns_median)
            )
        return end


def generate(cfg: GenConfig, out: str | Path) -> int:
    """Write a trace for `cfg` to `out`; returns the number of requests."""
    gen = _Gen(cfg)
    # Sessions are generated from time 0, then shifted onto Poisson start times.
    firsts = []
    for _ in range(cfg.sessions):
        firsts.append(len(gen.reqs))
        gen.root(0.0)
    n = len(gen.reqs)
    duration = cfg.duration_s
    if duration is None:
        duration = n / (cfg.rpm_per_instance * cfg.instances / 60.0)
    starts = np.sort(gen.rng.uniform(0.0, duration, cfg.sessions))
    bounds = [*firsts, n]
    for s in range(cfg.sessions):
        for r in gen.reqs[bounds[s] : bounds[s + 1]]:
            r.time += float(starts[s])
    order = sorted(range(n), key=lambda i: gen.reqs[i].time)
    chat_id = [0] * n
    for pos, i in enumerate(order):
        chat_id[i] = pos
    arrays: dict[int, np.ndarray] = {}  # one array per context list; requests take prefixes
    with Path(out).open("wb") as f:
        for i in order:
            r = gen.reqs[i]
            head = orjson.dumps(
                {
                    "chat_id": chat_id[i],
                    "parent_chat_id": chat_id[r.parent] if r.parent >= 0 else -1,
                    "timestamp": round(r.time, 3),
                    "input_length": r.input_len,
                    "output_length": r.output_len,
                    "type": "text",
                    "turn": r.turn,
                    "trigger": r.trigger,
                }
            )
            arr = arrays.get(id(r.epoch))
            if arr is None:
                arr = arrays[id(r.epoch)] = np.asarray(r.epoch, dtype=np.int64)
            ids = orjson.dumps(arr[: r.n_full], option=orjson.OPT_SERIALIZE_NUMPY)
            if r.partial >= 0:
                ids = ids[:-1] + (b"," if r.n_full else b"") + str(r.partial).encode() + b"]"
            f.write(head[:-1] + b',"hash_ids":' + ids + b"}\n")
    return n
