"""Agent sessions over the OpenAI API, reading the router's decision headers.

Each session has a shared system prompt, its own task, and then turns in which the agent appends the
model's reply and a tool result and asks again — the request shape of a coding agent. The report
says where first turns went, how often a follow-up landed on its previous turn's worker, and whether
the worker's reported cached_tokens covered the carried history. Under PD disaggregation the worker
is the prefill instance, and cached_tokens cover the previous prompt but not the previous reply
(it was generated on a decode instance), so the covered share is expected to be low there.

With `--tools` the sessions speak as coding agents do over the wire: tool definitions on every
request, each reply sent back as an assistant message carrying a structured `tool_calls` entry, then
a `role: tool` result starting with a newline. The model's reply text is kept but the call is the
agent's, so the worker holds the previous prompt, not the rendered call: the report's
`followup_prompt_covered_share` (cached_tokens reach the previous prompt's full pages) is the
measure there, and it only needs the usage block, so it works through any router.

    python -m smetric_router.loadgen.sessions --url http://127.0.0.1:30000 --sessions 16 --turns 5
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson
from openai import AsyncOpenAI

from smetric_router.features.chat_tokenizer import load_chat_tokenizer
from smetric_router.features.extract import FeatureExtractor
from smetric_router.traces.to_agentic import AGENT_TOOLS

SYSTEM_PROMPT = (
    "You are a coding agent. You read files, run tools and edit code until the task is done. "
    "Answer with one tool call or a short explanation. "
) * 8


@dataclass(frozen=True, slots=True)
class TurnRecord:
    session: int
    turn: int
    worker: str
    reason: str
    cached_tokens: int
    history_tokens: int  # tokens of the carried history a sticky worker should hold (page-aligned)
    prompt_tokens: int = 0  # this request's prompt, as the worker counted it


@dataclass
class SessionReport:
    records: list[TurnRecord] = field(default_factory=list)

    def first_turn_workers(self) -> Counter[str]:
        return Counter(r.worker for r in self.records if r.turn == 0)

    def followups(self) -> list[tuple[TurnRecord, TurnRecord]]:
        """(previous turn, follow-up) pairs."""
        by_key = {(r.session, r.turn): r for r in self.records}
        return [(by_key[(r.session, r.turn - 1)], r) for r in self.records if r.turn > 0]

    def stuck_share(self) -> float:
        pairs = self.followups()
        return sum(p.worker == f.worker for p, f in pairs) / max(1, len(pairs))

    def covered_share(self) -> float:
        pairs = self.followups()
        return sum(f.cached_tokens >= f.history_tokens for _, f in pairs) / max(1, len(pairs))

    def prompt_covered_share(self, page_size: int = 16) -> float:
        """Follow-ups whose cached_tokens reach the previous prompt's full pages."""
        pairs = self.followups()
        hit = sum(f.cached_tokens >= p.prompt_tokens // page_size * page_size for p, f in pairs)
        return hit / max(1, len(pairs))

    def reasons(self) -> Counter[str]:
        return Counter(r.reason for r in self.records)

    def summary(self) -> dict[str, Any]:
        return {
            "requests": len(self.records),
            "first_turn_workers": dict(self.first_turn_workers()),
            "followup_same_worker_share": round(self.stuck_share(), 4),
            "followup_history_covered_share": round(self.covered_share(), 4),
            "followup_prompt_covered_share": round(self.prompt_covered_share(), 4),
            "reasons": dict(self.reasons()),
        }


def _placed_on(headers: Any) -> str:
    # Under PD the session's cache lives on its prefill instance; the decode side holds no history.
    return str(headers.get("x-smetric-prefill-worker") or headers.get("x-smetric-worker", ""))


def history_tokens(features: FeatureExtractor, messages: list[dict[str, Any]]) -> int:
    """The carried history, as the router counts it (est_hit: the prompt's tokens through the last
    reply's end-of-turn token, rendered with the model's template), rounded down to a page: what
    a worker that served the previous turn must report as cached."""
    est_hit = features.from_chat({"messages": messages}).est_hit
    return est_hit // features.page_size * features.page_size


_VOCAB = ("read", "file", "src", "main", "test", "error", "line", "def", "class", "return",
          "import", "value", "config", "patch")  # fmt: skip


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_VOCAB) for _ in range(n))


def _tool_call(rng: random.Random, sid: int, turn: int) -> dict[str, Any]:
    args = orjson.dumps({"cmd": f"pytest -x tests/test_{rng.choice(_VOCAB)}.py"}).decode()
    return {"id": f"call_{sid}_{turn}", "type": "function",
            "function": {"name": "run", "arguments": args}}  # fmt: skip


async def run_session(
    client: AsyncOpenAI, model: str, features: FeatureExtractor, sid: int, turns: int,
    max_tokens: int, seed: int, tools: bool = False,
) -> list[TurnRecord]:  # fmt: skip
    rng = random.Random(seed * 1000 + sid)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"Task {sid}: " + _words(rng, 120)},
    ]
    extra: dict[str, Any] = {"tools": AGENT_TOOLS} if tools else {}
    out = []
    for turn in range(turns):
        raw = await client.chat.completions.with_raw_response.create(
            model=model,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=max_tokens,
            # the length is the load's, and the call is the agent's: no natural end, no model call
            extra_body={"ignore_eos": True},
            **extra,
        )
        reply = raw.parse()
        usage = reply.usage
        details = usage.prompt_tokens_details if usage else None
        cached = (details.cached_tokens or 0) if details else 0
        hist = history_tokens(features, messages) if turn else 0
        out.append(TurnRecord(sid, turn, _placed_on(raw.headers),
                              raw.headers.get("x-smetric-reason", ""), cached, hist,
                              usage.prompt_tokens if usage else 0))  # fmt: skip
        text = reply.choices[0].message.content or ""
        if tools:
            call = _tool_call(rng, sid, turn)
            messages.append({"role": "assistant", "content": text, "tool_calls": [call]})
            messages.append({"role": "tool", "tool_call_id": call["id"],
                             "content": "\n  " + _words(rng, 80)})  # fmt: skip
        else:
            messages.append({"role": "assistant", "content": text})
            messages.append({"role": "user", "content": "Tool result: " + _words(rng, 80)})
    return out


async def run_sessions(
    url: str, sessions: int = 16, turns: int = 5, page_size: int = 16, max_tokens: int = 32,
    model: str | None = None, seed: int = 0, tokenizer_path: str | None = None,
    chat_template: str | None = None, tools: bool = False,
) -> SessionReport:  # fmt: skip
    """tokenizer_path / chat_template: the workers' model, as the router's options of that name
    (they only count the history_tokens of the report)."""
    chat = load_chat_tokenizer(tokenizer_path, chat_template)
    features = FeatureExtractor(chat, page_size=page_size, keep_text=False)
    key = os.environ.get("SMETRIC_API_KEY", "none")  # a router started with --api-key
    async with AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0) as client:
        if model is None:
            models = (await client.models.list()).data
            if not models:
                raise SystemExit(
                    f"{url} serves no model yet: is the router ready (GET /readiness)?"
                )
            model = models[0].id
        results = await asyncio.gather(
            *(run_session(client, model, features, s, turns, max_tokens, seed, tools)
              for s in range(sessions))
        )  # fmt: skip
    return SessionReport([r for rs in results for r in rs])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:30000", help="router base URL")
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=32, help="output tokens per turn")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--records", action="store_true", help="also print every request's record")
    p.add_argument(
        "--tokenizer-path", help="the workers' model directory (as the router's; default: bundled)"
    )
    p.add_argument("--chat-template", help="the workers' --chat-template .jinja file, if any")
    p.add_argument(
        "--tools",
        action="store_true",
        help="agent wire shape: tools, assistant tool_calls, tool results",
    )
    a = p.parse_args(argv)
    report = asyncio.run(run_sessions(a.url, a.sessions, a.turns, a.page_size, a.max_tokens,
                                      seed=a.seed, tokenizer_path=a.tokenizer_path,
                                      chat_template=a.chat_template,
                                      tools=a.tools))  # fmt: skip
    doc: dict[str, Any] = report.summary()
    if a.records:
        doc["records"] = [asdict(r) for r in report.records]
    sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
