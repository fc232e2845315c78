"""What smetric-router's feature extraction costs per request on benchmarks.compare's workload.

    python -m benchmarks.extract_replay                      # compare's default workload
    python -m benchmarks.extract_replay --conversations 16 --out benchmarks/results/x.md
    python -m benchmarks.extract_replay --replicas 4          # as four router processes

Builds the workload benchmarks.compare builds (the same generator, converter and options, in
its work dir), then replays its requests through one FeatureExtractor on this thread, with the
emulated workers' chat template and tokenizer, in the order a concurrent run interleaves them:
turn k of every conversation, then turn k + 1. Each follow-up carries its conversation so far,
with a fixed reply (~40 tokens) where bench_serving puts the server's. It reports the mean time
per request, first turns and follow-ups apart, and the part spent in the tokenizer. No workers
and no HTTP: the extraction alone on one core, beside which benchmarks.compare's router CPU per
request (the whole router under load) can be read. With --replicas N the requests are dealt
round-robin to N extractors, as N router processes behind one port receive a conversation's
turns (bench_serving's pooled connections carry no affinity): a follow-up that reaches an
extractor which has not seen its previous turn renders and tokenizes its history again.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.compare import Setup, workload
from smetric_router.features.chat_tokenizer import load_chat_tokenizer
from smetric_router.features.extract import FeatureExtractor
from smetric_router.features.prompt_tokenizer import PromptTokenizer
from smetric_router.launch.tiny_model import TEMPLATE

REPLY = "Sure, here is what I found in the file you asked about and what I will do next. " * 2


@dataclass(frozen=True, slots=True)
class Cost:
    first_turns: int
    follow_ups: int
    first_s: float  # extraction time of all first turns
    follow_s: float
    tokenizer_s: float  # of the two, in the tokenizer
    prompt_tokens: int

    @property
    def requests(self) -> int:
        return self.first_turns + self.follow_ups

    def per_request_ms(self, seconds: float, n: int | None = None) -> float:
        count = self.requests if n is None else n
        return 1e3 * seconds / count if count else 0.0


@contextmanager
def timed_tokenizer(spent: list[float]) -> Iterator[None]:
    """Adds the time of every PromptTokenizer._encode call to spent[0] while inside."""
    original: Callable[..., list[int]] = PromptTokenizer._encode

    def encode(self: PromptTokenizer, *args: Any, **kwargs: Any) -> list[int]:
        start = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - start

    PromptTokenizer._encode = encode  # type: ignore[method-assign]
    try:
        yield
    finally:
        PromptTokenizer._encode = original  # type: ignore[method-assign]


def replay(
    conversations: Sequence[Sequence[dict[str, Any]]], page_size: int = 16, replicas: int = 1
) -> Cost:
    """Extracts every request of `conversations` (bench_serving's agentic-trace rounds: each a
    {"messages": [...]} of what the round adds) in interleaved order, dealt round-robin to
    `replicas` extractors."""
    chat = load_chat_tokenizer(None, str(TEMPLATE))
    # as the router keeps them with `--l3-view master` (compare's Mooncake config)
    extractors = [
        FeatureExtractor(chat, page_size=page_size, keep_text=False, keep_digests=True)
        for _ in range(replicas)
    ]
    sent = 0
    history: list[list[dict[str, Any]]] = [[] for _ in conversations]
    times = {True: 0.0, False: 0.0}
    counts = {True: 0, False: 0}
    spent, tokens = [0.0], 0
    with timed_tokenizer(spent):
        for k in range(max((len(c) for c in conversations), default=0)):
            for i, rounds in enumerate(conversations):
                if k >= len(rounds):
                    continue
                history[i] = [*history[i], *rounds[k]["messages"]]
                body = {"model": "m", "messages": history[i], "max_tokens": 32}
                features = extractors[sent % replicas]
                sent += 1
                start = time.perf_counter()
                f = features.from_chat(body)
                times[k == 0] += time.perf_counter() - start
                counts[k == 0] += 1
                tokens += f.prompt_len
                history[i] = [*history[i], {"role": "assistant", "content": REPLY}]
    return Cost(counts[True], counts[False], times[True], times[False], spent[0], tokens)


def report(cost: Cost, meta: dict[str, Any], argv: Sequence[str], replicas: int = 1) -> str:
    total = cost.first_s + cost.follow_s
    return "\n".join([
        "# Feature extraction per request, benchmarks.compare's workload replayed",
        "",
        f"Command: `python -m benchmarks.extract_replay {' '.join(argv)}`; "
        f"{platform.processor() or platform.machine()}, Python {platform.python_version()}.",
        "",
        f"Workload: {meta.get('conversations')} conversations, {cost.requests} requests "
        f"(mean first prompt {meta.get('mean_first_prompt_tokens')} tokens; "
        f"{cost.prompt_tokens // max(cost.requests, 1)} prompt tokens per request on average), "
        "rendered with the emulated workers' chat template and tokenized with their tokenizer, "
        "one request at a time on one core, turn by turn across the conversations"
        + (
            f", dealt round-robin to {replicas} extractors (as {replicas} router processes)."
            if replicas > 1
            else "."
        ),
        "",
        "| requests | extraction (ms/request) | first turns (ms each) | follow-ups (ms each) | "
        "of which tokenizer (ms/request) |",
        "|---|---|---|---|---|",
        f"| {cost.requests} | {cost.per_request_ms(total):.2f} | "
        f"{cost.per_request_ms(cost.first_s, cost.first_turns):.1f} | "
        f"{cost.per_request_ms(cost.follow_s, cost.follow_ups):.2f} | "
        f"{cost.per_request_ms(cost.tokenizer_s):.2f} |",
        "",
    ])  # fmt: skip


def main(argv: Sequence[str] | None = None) -> Cost:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--conversations", type=int, default=Setup().conversations)
    p.add_argument("--sessions", type=int, default=Setup().sessions)
    p.add_argument(
        "--max-turns",
        type=int,
        default=Setup().max_turns,
        help="longest conversation kept, in turns (benchmarks.compare's default)",
    )
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/smetric-compare/extract-replay"))
    p.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="deal the requests round-robin to this many extractors, as that many router "
        "processes receive them (default 1: one router)",
    )
    p.add_argument("--out", type=Path, help="write the report here (else print it)")
    a = p.parse_args(argv)
    if a.replicas < 1:
        p.error(f"--replicas must be >= 1, got {a.replicas}")
    a.work_dir.mkdir(parents=True, exist_ok=True)
    setup = replace(
        Setup(), conversations=a.conversations, sessions=a.sessions, max_turns=a.max_turns
    )
    load = workload(setup, None, a.work_dir)
    conversations = json.loads(load.path.read_text())["conversations"]
    cost = replay(conversations, replicas=a.replicas)
    text = report(cost, load.meta, list(argv) if argv is not None else [], a.replicas)
    if a.out is not None:
        a.out.write_text(text)
    print(text)
    return cost


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
