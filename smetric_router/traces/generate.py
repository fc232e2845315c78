"""Agentic trace generator: Bailian-schema JSONL plus `trigger`, `history_length` and
`history_turns` fields, calibrated to published agentic traces (paper §3).

Each request also says what a router reads off it: `history_length`, the prompt's tokens through
its last assistant reply (the router's est_hit), and `history_turns`, the replies it carries (the
router's turn). A compaction's prompt (system prompt + summary) carries none; a sub-agent's first
request carries the replies in the part of its parent's context it re-uses. A follow-up whose
parent fell before the window says the same as if the parent were in the file.

Model. A root session starts with a *user* request: one of tens of agent-type system prompts
(instructions + tool schemas of an agent framework) followed by the user's task. Then the agent
loops: each *agent* request re-sends the whole history plus the previous reply and a tool result,
seconds after the previous one; when a loop ends the user may send another message minutes later
(*user* request) and a new loop starts. Once the history passes a per-session threshold the next
request is a *compaction*: its prompt is the system prompt plus a fresh summary, so the prefix chain
breaks and later turns extend the summary. A few user gaps last about an hour. Now and then an
agent turn forks sub-agents: each is a new session (new chat chain) whose first request carries a
prefix of the parent's context plus a sub-task, with the turn number continuing the parent's (its
messages hold the parent's history, so a router that infers turns from the request sees a
follow-up); the parent resumes when its sub-agents finish. Hash ids are prefix-chained blocks of
`block_size` tokens: a block's id is shared exactly when its whole prefix is; the last, partial
block of a prompt gets an id of its own. Everything is drawn from one
`numpy.random.Generator(seed)`, so a seed fixes the file byte for byte.

Steady state. Sessions run tens of turns over tens of minutes, so a trace whose sessions all start
at time 0 is mostly young sessions for its first hour. The file is therefore a *window* cut out of
a running workload: `sessions` root sessions start (uniformly, i.e. Poisson) during the window
[0, D), where D makes the steady rate `rpm_per_instance * instances`; sessions that started during
the `warmup_s` before it (same start rate) contribute their later requests; requests before 0 or
at/after D are not written. A follow-up whose earlier turns fell before the window keeps its turn
number and names its missing parent by an id absent from the file (as in a trace cut out of a
longer one), so it has no first request in the file. A replay starts with empty caches, so the
window's first minutes miss every carried-over session's history; `lead_in_s` also writes the
warm-up's last seconds (timestamps shift so the window starts at `lead_in_s`) for a replay to warm
its caches on and measure from there (`traces stats --from-s`).

Calibration knobs (`GenConfig`) and the published fact each one targets:
- Turns per session (median 33 turns in Codex sessions, vLLM x Mooncake study; ~80 LLM steps per
  session, TraceLab; the paper: first requests "only a small fraction of all requests"):
  `user_continue_p` (geometric number of user messages, mean 1 / (1 - p)) times
  `loop_turns_median` / `loop_turns_sigma` (agent turns after each user message, at least one: the
  draw is max(1, round(lognormal)), whose median is the knob): a whole session, forks included,
  has median ~31 / mean ~52 requests and lasts median ~30 / mean ~54 min.
- System prompts, 18-20 % of reuse (paper Fig. 5), "similar prompt template ... per agent
  framework" (§3): `templates` (tens of agent types), `template_zipf` (their popularity),
  `template_tokens_*` (a few K tokens each: instructions + tool schemas). Every request of a session
  re-sends its template, so template tokens are ~10-15 % of prompt tokens.
- Reuse > 80 % (Finding 3.1): `task_tokens_*` (the new text a fresh session brings) against
  `tool_tokens_*`, `user_tokens_*`, `output_tokens_*` (what each turn adds to the history it
  re-sends).
- Intra-session ~2/3 of reuse, the rest mostly forked agents (Finding 3.1 and its note): `fork_p`
  (per agent turn of a root session), `fork_children_max`, `fork_prefix_min` (how much of the
  parent's context a sub-agent re-uses), `fork_turns_median` (sub-agent length).
- ~90 % of reuse within ~100 s, tail to hours (Fig. 6): `agent_gap_*` plus `decode_s_per_token`
  (agent turns seconds apart), `slow_tool_*` (builds and test runs of minutes), `user_gap_*`
  (minutes), `resume_p` and `resume_gap_*` (a user back after about an hour).
- Trigger mix, mostly agent (Fig. 7): the turn knobs against `user_continue_p`; compaction from
  `compact_at_tokens` (also bounds contexts at ~100K tokens).
- Heavy-tailed tokens per session (Finding 3.2, Fig. 8): `long_session_p` long interactive tasks
  (`long_user_continue_p`) among the others, lognormal `loop_turns_sigma`, geometric user loops
  (context grows with every turn, so a long session's tokens grow quadratically).
- Requests per minute per instance (mean 43 at 32 instances, Finding 3.2): `rpm_per_instance` and
  `instances` set D (above); `duration_s` overrides it.

`sessions` counts root sessions starting inside the window; forked sub-agent sessions and the
warm-up's sessions come on top.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

# Sessions start this long before the written window: the paper's 2 h collection window, which
# covers all but the longest sessions (resumed after an hour).
WARMUP_S = 7200.0


@dataclass(frozen=True, slots=True)
class GenConfig:
    sessions: int = 200
    seed: int = 0
    duration_s: float | None = None  # window length; None: set by rpm_per_instance * instances
    warmup_s: float = WARMUP_S
    lead_in_s: float = 0.0  # also write the warm-up's last seconds (<= warmup_s): a cache warm-up
    block_size: int = 16
    rpm_per_instance: float = 43.0  # paper Finding 3.2, Trace 1
    instances: int = 32
    templates: int = 40  # tens of agent types (paper §3: one template per framework)
    template_zipf: float = 1.0
    template_tokens_median: float = 5_000.0  # a few K tokens of instructions + tool schemas
    template_tokens_sigma: float = 0.4
    task_tokens_median: float = 3_000.0
    task_tokens_sigma: float = 1.0
    task_tokens_max: int = 40_000
    loop_turns_median: float = 12.0  # agent turns after each user message (>= 1)
    loop_turns_sigma: float = 0.8
    user_continue_p: float = 0.5  # user messages per session: geometric, mean 2
    long_session_p: float = 0.05  # long interactive agent tasks
    long_user_continue_p: float = 0.85
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
    user_gap_median_s: float = 120.0
    user_gap_sigma: float = 1.0
    resume_p: float = 0.05
    resume_gap_median_s: float = 3600.0
    resume_gap_sigma: float = 0.5
    compact_at_tokens: tuple[int, int] = (60_000, 100_000)
    summary_tokens_median: float = 3_000.0
    fork_p: float = 0.015
    fork_children_max: int = 3
    fork_prefix_min: float = 0.5
    fork_turns_median: float = 8.0
    subtask_tokens_median: float = 300.0


# A context is a list of id runs (first id, count): prefix-chained ids are fresh ranges appended
# as the context grows, so a run list is small where a list of ids would hold thousands.
_Runs = list[tuple[int, int]]


@dataclass(slots=True)
class _Context:
    """A growing prompt: its full blocks' id runs, the token count of its partial last block, and
    where (in tokens) each assistant reply in it ends: what a router reads off the prompt."""

    runs: _Runs
    blocks: int = 0
    tail: int = 0
    replies: list[int] = field(default_factory=list)

    def copy(self) -> _Context:
        return _Context(list(self.runs), self.blocks, self.tail, list(self.replies))

    def prefix(self, blocks: int, block_size: int) -> _Context:
        runs: _Runs = []
        left = blocks
        for start, n in self.runs:
            if left <= 0:
                break
            runs.append((start, min(n, left)))
            left -= n
        kept = [end for end in self.replies if end <= blocks * block_size]
        return _Context(runs=runs, blocks=blocks, replies=kept)


@dataclass(slots=True)
class _Req:
    time: float
    parent: int  # index of the previous request of the chain in generation order, -1 for a root
    turn: int  # 1-based, as in the public Bailian trace
    input_len: int
    output_len: int
    trigger: str
    runs: _Runs  # the context's runs (it grows later); this request's full blocks are a prefix
    partial: int  # id of the partial last block, -1 when none
    history_len: int  # tokens through the prompt's last assistant reply (the router's est_hit)
    history_turns: int  # assistant replies in the prompt (the router's turn)


class _Gen:
    def __init__(self, cfg: GenConfig) -> None:
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)
        self.next_id = 0
        self.reqs: list[_Req] = []
        self.offset = 0.0  # start time of the session being generated
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

    def count(self, median: float) -> int:
        """A turn count: at least 1, median `median` (rounding keeps the median)."""
        return max(1, round(self.lognormal(median, self.cfg.loop_turns_sigma)))

    def new_ids(self, n: int) -> int:
        first = self.next_id
        self.next_id += n
        return first

    def replied(self, ctx: _Context, out: int, then: int) -> _Context:
        """`ctx` with the assistant's reply of `out` tokens and `then` tokens after it."""
        ctx.replies.append(ctx.blocks * self.cfg.block_size + ctx.tail + out)
        return self.grown(ctx, out + then)

    def grown(self, ctx: _Context, n: int) -> _Context:
        """`ctx` with `n` more tokens (in place): the partial block and new ones get fresh ids."""
        total = ctx.tail + n
        k = total // self.cfg.block_size
        if k:
            ctx.runs.append((self.new_ids(k), k))
            ctx.blocks += k
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
                time=self.offset + t,
                parent=parent,
                turn=turn,
                input_len=ctx.blocks * c.block_size + ctx.tail,
                output_len=out,
                trigger=trigger,
                runs=ctx.runs,
                partial=self.new_ids(1) if ctx.tail else -1,
                history_len=ctx.replies[-1] if ctx.replies else 0,
                history_turns=len(ctx.replies),
            )
        )
        return len(self.reqs) - 1, out

    def root(self, start: float) -> None:
        c = self.cfg
        self.offset = start
        system = self.templates[int(self.rng.choice(c.templates, p=self.template_p))]
        ctx = self.grown(
            system.copy(), self.tokens(c.task_tokens_median, c.task_tokens_sigma, c.task_tokens_max)
        )
        long = self.rng.random() < c.long_session_p
        loops = int(
            self.rng.geometric(1.0 - (c.long_user_continue_p if long else c.user_continue_p))
        )
        self.session(0.0, ctx, system, 1, "user", loops, c.loop_turns_median)

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
                self.replied(ctx, out, self.tokens(c.user_tokens_median, c.user_tokens_sigma))
                turn += 1
                key, out = self.emit(t, ctx, key, turn, "user")
            for _ in range(self.count(loop_median)):
                t += out * c.decode_s_per_token
                if self.rng.random() < c.slow_tool_p:
                    t += self.lognormal(c.slow_tool_median_s, c.slow_tool_sigma)
                else:
                    t += self.lognormal(c.agent_gap_median_s, c.agent_gap_sigma)
                turn += 1
                if ctx.blocks * c.block_size >= compact_at:
                    summary = self.tokens(c.summary_tokens_median, 0.5)
                    ctx = self.grown(system.copy(), summary)
                    key, out = self.emit(t, ctx, key, turn, "compaction")
                    continue
                tool = self.tokens(c.tool_tokens_median, c.tool_tokens_sigma, c.tool_tokens_max)
                self.replied(ctx, out, tool)
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
            child = parent.prefix(max(1, round(parent.blocks * share)), c.block_size)
            self.grown(child, self.tokens(c.subtask_tokens_median, 1.0))
            start = t + float(self.rng.uniform(0.1, 1.0))
            end = max(
                end, self.session(start, child, system, turn + 1, "agent", 1, c.fork_turns_median)
            )
        return end


def _ids(runs: _Runs) -> np.ndarray:
    if not runs:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(s, s + n, dtype=np.int64) for s, n in runs])


def generate(cfg: GenConfig, out: str | Path) -> int:
    """Write the window of a trace for `cfg` to `out`; returns the number of requests written."""
    if not 0.0 <= cfg.lead_in_s <= cfg.warmup_s:
        raise ValueError(f"lead_in_s must be in [0, warmup_s], got {cfg.lead_in_s:g}")
    gen = _Gen(cfg)
    # The window's sessions are generated first (their request count sets the window's length),
    # then start times are drawn and the warm-up's sessions generated at theirs.
    firsts = []
    for _ in range(cfg.sessions):
        firsts.append(len(gen.reqs))
        gen.root(0.0)
    n_window = len(gen.reqs)
    duration = cfg.duration_s
    if duration is None:
        # In steady state the window sees, per session started, its requests that come within
        # warmup_s of its start (older sessions are not generated).
        live = sum(r.time <= cfg.warmup_s for r in gen.reqs)
        duration = live / (cfg.rpm_per_instance * cfg.instances / 60.0)
    starts = np.sort(gen.rng.uniform(0.0, duration, cfg.sessions))
    bounds = [*firsts, n_window]
    for s in range(cfg.sessions):
        for r in gen.reqs[bounds[s] : bounds[s + 1]]:
            r.time += float(starts[s])
    warm = int(gen.rng.poisson(cfg.sessions * cfg.warmup_s / duration)) if cfg.warmup_s > 0 else 0
    for start in np.sort(gen.rng.uniform(-cfg.warmup_s, 0.0, warm)):
        gen.root(float(start))
    kept = sorted(
        (i for i, r in enumerate(gen.reqs) if -cfg.lead_in_s <= r.time < duration),
        key=lambda i: gen.reqs[i].time,
    )
    chat_id = {i: pos for pos, i in enumerate(kept)}
    arrays: dict[int, np.ndarray] = {}  # one array per context; requests take prefixes
    with Path(out).open("wb") as f:
        for i in kept:
            r = gen.reqs[i]
            parent = -1
            if r.parent >= 0:  # a parent before the window gets an id absent from the file
                parent = chat_id.setdefault(r.parent, len(chat_id))
            head = orjson.dumps(
                {
                    "chat_id": chat_id[i],
                    "parent_chat_id": parent,
                    "timestamp": round(r.time + cfg.lead_in_s, 3),
                    "input_length": r.input_len,
                    "output_length": r.output_len,
                    "type": "text",
                    "turn": r.turn,
                    "trigger": r.trigger,
                    "history_length": r.history_len,
                    "history_turns": r.history_turns,
                }
            )
            arr = arrays.get(id(r.runs))
            if arr is None:  # generation is over: the context's runs are final
                arr = arrays[id(r.runs)] = _ids(r.runs)
            n_full = r.input_len // cfg.block_size
            ids = orjson.dumps(arr[:n_full], option=orjson.OPT_SERIALIZE_NUMPY)
            if r.partial >= 0:
                ids = ids[:-1] + (b"," if n_full else b"") + str(r.partial).encode() + b"]"
            f.write(head[:-1] + b',"hash_ids":' + ids + b"}\n")
    return len(kept)
