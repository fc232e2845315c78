"""Project traces -> SGLang bench_serving's agentic-trace JSON (`--dataset-name agentic-trace`).

    python -m smetric_router.traces.to_agentic TRACE.jsonl --out conv.json
    python -m smetric_router.traces.to_agentic ../shared/traces/mooncake-toolagent.jsonl \\
        --out mc.json --conversations 64 --max-turns 8 --tokens-per-block 64

The output is the shape `sglang.benchmark.datasets.agentic_trace` reads (SGLang 0.5.23)::

    {"metadata": {...},
     "conversations": [[{"messages": [{"role": "system", ...}, {"role": "user", ...}],
                         "prompt_tokens": N}, {"messages": [{"role": "user", ...}], ...}, ...]]}

Each turn holds only the new non-assistant messages; bench_serving replays a conversation round by
round and feeds the server's real reply back as the assistant message, so the reply's length is
bench_serving's fixed `--sharegpt-output-len`, not the trace's per-request output length
(`metadata.mean_output_tokens` says what the trace had).

Text. Traces carry block hash ids, not text. Every block id becomes a fixed run of single-token
words (`features.sample_text.TextSampler`, seeded by the id) of `--tokens-per-block` tokens in the
bundled tokenizer: equal ids give equal text, so what the trace shares (a system prompt used by
many sessions, a forked sub-agent's copy of its parent's context, a session's own history) is
shared text here. `--tokens-per-block` below the trace's block size scales prompts down (the
default keeps the trace's sizes).

Conversations. A trace's session (Bailian `chat_id` chain, generated sub-agents are sessions of
their own; Mooncake sessions inferred by the loader) becomes one conversation, its requests in
turn order. The first turn is a system message (the leading blocks also opening another session's
first request: the shared system prompt) plus a user message (the rest). A follow-up turn is one
user message with the trace tokens its prompt adds after the previous prompt and that prompt's
reply. A request that does not extend the previous one (a compaction, a sibling branch, a shorter
prompt) starts a new conversation: the format can only append. Arrival times and gaps between
turns are not kept: bench_serving sends conversations at its own `--request-rate` and each turn as
soon as the previous reply ends.

Agents (`--agent`). Every request carries coding-agent tool definitions (`metadata.tools`, sent with
bench_serving's `--extra-request-body '{"tools": ...}'`; the model's template renders them into the
system turn) and a follow-up's new text reads as a tool's output (a newline and indentation first).
It stays a user message: bench_serving's multi-turn replay keeps only the role and content of each
message, and OpenAI's schema requires `tool_call_id` on a `role: tool` message (smg 1.13 refuses
one without: 400), so structured tool calls and results are sent by
`smetric_router.loadgen.sessions --tools` instead. The replies are the server's own text.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from tokenizers import Tokenizer

from smetric_router.features.sample_text import TextSampler
from smetric_router.traces.loaders import FORMATS, detect_format, load_trace
from smetric_router.traces.schema import TraceRequest

DEFAULT_TOKENIZER = Path(__file__).resolve().parent.parent / "assets" / "tokenizer"


def _tool(name: str, description: str, **params: str) -> dict[str, Any]:
    props = {k: {"type": "string", "description": v} for k, v in params.items()}
    schema = {"type": "object", "properties": props, "required": list(params)}
    function = {"name": name, "description": description, "parameters": schema}
    return {"type": "function", "function": function}


# What a coding agent declares on every request (its tools sit in the system turn of the prompt).
AGENT_TOOLS: list[dict[str, Any]] = [
    _tool("read_file", "Read a file of the repository.", path="path from the repository root"),
    _tool("run", "Run a shell command in the repository and return its output.", cmd="the command"),
    _tool("edit_file", "Replace a string in a file.", path="the file", old="the exact old text",
          new="the replacement"),
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Options:
    conversations: int = 0  # 0: all
    max_turns: int = 0  # 0: all; longer conversations are cut
    min_turns: int = 1  # conversations with fewer turns are left out
    tokens_per_block: int = 0  # 0: the trace's block size (no scaling)
    max_prompt_tokens: int = 0  # 0: no cap; a conversation ends before a turn past it
    agent: bool = False  # tool definitions in the metadata, follow-ups read as tool output


class _Blocks:
    """Block id -> text of `tokens` single-token words (deterministic, cached)."""

    def __init__(self, tokenizer_dir: Path, tokens: int) -> None:
        self._sampler = TextSampler(Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")))
        self.tokens = tokens
        self._text = functools.lru_cache(maxsize=None)(self._make)

    def _make(self, block_id: int) -> str:
        return self._sampler.sample(self.tokens, seed=block_id)[0]

    def text(self, ids: Sequence[int]) -> str:
        return "".join(self._text(b) for b in ids)


def _chains(reqs: Sequence[TraceRequest]) -> list[list[TraceRequest]]:
    """Sessions split into append-only chains, ordered by their first request's arrival."""
    by_session: dict[str, list[TraceRequest]] = defaultdict(list)
    for r in reqs:
        by_session[r.session].append(r)
    chains: list[list[TraceRequest]] = []
    for rs in by_session.values():
        rs.sort(key=lambda r: (r.turn, r.arrival_s))
        cur: list[TraceRequest] = []
        for r in rs:
            if cur and _extends(cur[-1], r):
                cur.append(r)
            else:
                if cur:
                    chains.append(cur)
                cur = [r]
        chains.append(cur)
    chains.sort(key=lambda c: (c[0].arrival_s, c[0].req_id))
    return chains


def _extends(prev: TraceRequest, r: TraceRequest) -> bool:
    """r re-sends prev's prompt (all its full blocks) and adds to it."""
    if r.trigger == "compaction" or r.input_len <= prev.input_len:
        return False
    full = prev.input_len // prev.block_size
    return r.block_ids[:full] == prev.block_ids[:full]


def _scaled(trace_tokens: int, block_size: int, tpb: int) -> int:
    return max(1, math.ceil(trace_tokens * tpb / block_size))


def convert(reqs: Sequence[TraceRequest], opts: Options = Options(),
            tokenizer_dir: Path = DEFAULT_TOKENIZER) -> dict[str, Any]:  # fmt: skip
    """The agentic-trace document for these requests (see the module docstring)."""
    if not reqs:
        raise ValueError("no requests in the trace")
    bs = reqs[0].block_size
    tpb = opts.tokens_per_block or bs
    blocks = _Blocks(tokenizer_dir, tpb)
    chains = [c for c in _chains(reqs) if len(c) >= opts.min_turns]
    # leading blocks that also open another chain's first request: the shared system prompt
    opening = Counter((i, b) for c in chains for i, b in enumerate(c[0].block_ids))
    out: list[list[dict[str, Any]]] = []
    trace_out: list[int] = []
    for chain in chains:
        if opts.conversations and len(out) >= opts.conversations:
            break
        if opts.max_turns:
            chain = chain[: opts.max_turns]
        first = chain[0]
        ids = first.block_ids
        shared = 0
        while shared < len(ids) - 1 and opening[(shared, ids[shared])] >= 2:
            shared += 1
        msgs = [{"role": "user", "content": blocks.text(ids[shared:])}]
        if shared:
            msgs.insert(0, {"role": "system", "content": blocks.text(ids[:shared])})
        prompt = _scaled(first.input_len, bs, tpb)
        turns = [{"messages": msgs, "prompt_tokens": prompt}]
        trace_out.append(first.output_len)
        for prev, r in itertools.pairwise(chain):
            held = prev.input_len + prev.output_len  # trace tokens the client already has
            start = min(held // bs, len(r.block_ids) - 1)
            new_ids = r.block_ids[start:]
            prompt = _scaled(r.input_len, bs, tpb)
            if opts.max_prompt_tokens and prompt > opts.max_prompt_tokens:
                break
            text = blocks.text(new_ids)
            msg = {"role": "user", "content": "\n  " + text if opts.agent else text}
            turns.append({"messages": [msg], "prompt_tokens": prompt})
            trace_out.append(r.output_len)
        if opts.max_prompt_tokens and _scaled(first.input_len, bs, tpb) > opts.max_prompt_tokens:
            continue
        out.append(turns)
    if not out:
        raise ValueError("no conversation left after the filters")
    n_turns = [len(c) for c in out]
    return {
        "metadata": {
            "generator": "smetric_router.traces.to_agentic",
            "block_size": bs,
            "tokens_per_block": tpb,
            "conversations": len(out),
            "turns": sum(n_turns),
            "max_turns": max(n_turns),
            "mean_first_prompt_tokens": round(sum(c[0]["prompt_tokens"] for c in out) / len(out)),
            "mean_output_tokens": round(sum(trace_out) / len(trace_out)),
            **({"tools": AGENT_TOOLS} if opts.agent else {}),
        },
        "conversations": out,
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m smetric_router.traces.to_agentic",
        description="Convert a trace (generated, Bailian or Mooncake JSONL) to bench_serving's "
        "agentic-trace JSON (sglang.benchmark.serving --dataset-name agentic-trace).",
    )
    p.add_argument("trace", type=Path)
    p.add_argument("--out", type=Path, required=True, help="output JSON file")
    p.add_argument("--format", choices=("auto", *FORMATS), default="auto")
    p.add_argument("--block-size", type=int, default=16, help="Bailian files' tokens per hash id")
    p.add_argument("--conversations", type=int, default=0, help="first N conversations (0: all)")
    p.add_argument("--max-turns", type=int, default=0, help="cut conversations (0: no cut)")
    p.add_argument("--min-turns", type=int, default=1, help="drop shorter conversations")
    p.add_argument("--tokens-per-block", type=int, default=0,
                   help="tokens of text per hash id (0: the trace's block size)")  # fmt: skip
    p.add_argument("--max-prompt-tokens", type=int, default=0,
                   help="end a conversation before a longer prompt (0: no cap)")  # fmt: skip
    p.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER,
                   help="tokenizer directory the text is sampled in")  # fmt: skip
    p.add_argument(
        "--agent",
        action="store_true",
        help="tool definitions in metadata.tools; follow-ups read as tool output",
    )
    return p


def convert_file(trace: Path, out: Path, opts: Options, fmt: str = "auto", block_size: int = 16,
                 tokenizer_dir: Path = DEFAULT_TOKENIZER) -> dict[str, Any]:  # fmt: skip
    kind = detect_format(trace) if fmt == "auto" else fmt
    reqs = load_trace(trace, kind, block_size=block_size)  # type: ignore[arg-type]
    doc = convert(reqs, opts, tokenizer_dir)
    doc["metadata"] = {"source": str(trace), "format": kind, **doc["metadata"]}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(doc))
    return doc


def main(argv: Sequence[str] | None = None) -> None:
    a = build_parser().parse_args(argv)
    opts = Options(a.conversations, a.max_turns, a.min_turns, a.tokens_per_block,
                   a.max_prompt_tokens, a.agent)  # fmt: skip
    doc = convert_file(a.trace, a.out, opts, a.format, a.block_size, a.tokenizer)
    m = doc["metadata"]
    print(f"wrote {m['conversations']} conversations, {m['turns']} turns (max {m['max_turns']}), "
          f"first prompt ~{m['mean_first_prompt_tokens']} tokens, to {a.out}")  # fmt: skip


if __name__ == "__main__":
    main()
