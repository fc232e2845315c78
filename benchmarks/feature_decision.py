"""Routing cost of an agent follow-up: feature extraction + view build + SMetric decision.

For each history size the previous turn of one agent session was already extracted (warm caches)
and served by worker 0, whose KvIndex entry holds that turn's prompt pages; the other workers
hold the shared system prompt and another session each. Each timed follow-up appends a new
assistant tool call and a new tool result to that history (fresh content per iteration,
re-parsed from JSON so no string hash is cached), then is routed: extract -> KvIndex.match over
its page hashes for all workers -> ClusterView -> decide. JSON parsing is the HTTP layer's cost
and is reported separately, not included. Extraction renders the whole chat with the model's
chat template, as SGLang does (--template: the bundled ChatML one, or the tiny model's
Qwen3-Coder-style one), and tokenizes and hashes only what follows the previous prompt.

    python -m benchmarks.feature_decision --out benchmarks/results/feature_decision.md
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import time
from pathlib import Path
from typing import Any

import orjson
import tokenizers

from smetric_router.cluster.kv_index import KvIndex
from smetric_router.core.kv_events import GPU, BlockStored, KVEventBatch
from smetric_router.core.types import ClusterView, Reason, WorkerView
from smetric_router.features.chat_tokenizer import ChatTokenizer, load_chat_tokenizer
from smetric_router.features.extract import FeatureExtractor
from smetric_router.features.hashing import page_hashes
from smetric_router.features.sample_text import TextSampler
from smetric_router.policies import make_policy

PAGE_SIZE = 16
WORKERS = 32
TURN_TOKENS = 1024  # one agent step of history: a tool call and its result
SYSTEM_TOKENS = 256

Message = dict[str, Any]
TEMPLATES = {
    "chatml": None,  # the bundled tokenizer's own template
    "coder": str(Path(__file__).resolve().parents[1] / "smetric_router" / "assets" / "tiny_model"
                 / "chat_template.jinja"),
}  # fmt: skip
TOOLS = [{"type": "function", "function": {
    "name": "read", "description": "Read a file of the repository",
    "parameters": {"type": "object", "properties": {
        "path": {"type": "string", "description": "file path"},
        "limit": {"type": "integer", "description": "lines to read"}}},
}}]  # fmt: skip


class Stopwatch:
    """Time spent inside the chat tokenizer's template renders and tokenizer calls (the
    instance's methods wrapped; a few hundred nanoseconds of overhead per call)."""

    def __init__(self, chat: ChatTokenizer) -> None:
        self.spent = {"render": 0.0, "tokenize": 0.0}
        # the extractor's renders: the prompt (render_reusing) and est_hit's (shared_prefix)
        self._wrap(chat, "render_reusing", "render")
        self._wrap(chat, "shared_prefix", "render")
        self._wrap(chat.tokenizer, "encode_chat", "tokenize")

    def _wrap(self, obj: Any, method: str, phase: str) -> None:
        inner = getattr(obj, method)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.spent[phase] += time.perf_counter() - t

        setattr(obj, method, timed)

    def take(self) -> dict[str, float]:
        out = dict(self.spent)
        self.spent = dict.fromkeys(self.spent, 0.0)
        return out


class Codec:
    """The chat tokenizer under test and a sampler of exact-length text."""

    def __init__(self, chat: ChatTokenizer) -> None:
        self.chat = chat
        self.sampler = TextSampler(chat.tokenizer.backend)
        self.stopwatch = Stopwatch(chat)

    def sample(self, n_tokens: int, seed: int) -> str:
        return self.sampler.sample(n_tokens, seed)[0]

    def encode(self, text: str) -> list[int]:
        return self.chat.tokenizer.encode_chat(text)


def history(codec: Codec, tokens: int, seed: int) -> list[Message]:
    """system + user + (assistant tool call, tool result)* rendering to about `tokens` tokens."""
    rng = random.Random(seed)
    messages: list[Message] = [
        {"role": "system", "content": codec.sample(SYSTEM_TOKENS, 0)},
        {"role": "user", "content": codec.sample(64, seed)},
    ]
    sizer = FeatureExtractor(codec.chat, page_size=PAGE_SIZE, keep_text=False)
    size = sizer.from_chat({"messages": messages, "tools": TOOLS}).prompt_len
    step = 0
    while size < tokens:
        result = min(TURN_TOKENS, max(16, tokens - size)) - 64
        messages += follow_up(codec, rng, f"{seed}-{step}", max(result, 16))
        size = sizer.from_chat({"messages": messages, "tools": TOOLS}).prompt_len
        step += 1
    return messages


# What a coding agent's `read` tool returns: this repository's own Python source.
_PACKAGE = Path(__file__).resolve().parents[1] / "smetric_router"
_SOURCE = "".join(f.read_text() for f in sorted(_PACKAGE.glob("**/*.py")))


def source_result(codec: Codec, rng: random.Random, n_tokens: int) -> str:
    """Whole lines of source from a random place, the first run of them reaching n_tokens."""
    lines = _SOURCE.splitlines(keepends=True)
    start = rng.randrange(len(lines))
    end = start + 1
    while len(codec.encode("".join(lines[start:end]))) < n_tokens:
        end += 1
        if end > len(lines):
            start, end = 0, 1
    return "".join(lines[start:end])


def follow_up(
    codec: Codec, rng: random.Random, tag: str, result_tokens: int, content: str = "words"
) -> list[Message]:
    args = orjson.dumps({"path": f"src/{tag}.py", "limit": rng.randint(1, 999)}).decode()
    call = {
        "id": f"call_{tag}",
        "type": "function",
        "function": {"name": "read", "arguments": args},
    }
    if content == "source":
        result = source_result(codec, rng, result_tokens)
    else:
        result = codec.sample(result_tokens, rng.getrandbits(32))
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"call_{tag}", "content": result},
    ]


def stored(hashes: list[int], parent: int | None = None) -> KVEventBatch:
    return KVEventBatch(0.0, [BlockStored(hashes, parent, [], PAGE_SIZE, None, GPU)])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_size(
    codec: Codec, tokens: int, iterations: int, new_tokens: int, contents: list[str]
) -> dict[str, dict[str, Any]]:
    """One history size; the kinds of content alternate, so a slow phase of a shared machine
    falls on all of them alike. Returns a result per kind of content."""
    rng = random.Random(tokens)
    prior = history(codec, tokens, seed=tokens)
    chat = codec.chat
    reference = FeatureExtractor(chat, page_size=PAGE_SIZE)
    prior_prompt = reference.prompt_token_ids({"messages": prior, "tools": TOOLS})
    system = chat.render([chat.message(prior[0], 0)], TOOLS, {}, False)
    system_pages = page_hashes(chat.tokenizer.encode_chat(system), PAGE_SIZE)

    index = KvIndex()
    urls = [f"http://10.0.0.{i}:30000" for i in range(WORKERS)]
    index.apply(urls[0], stored(page_hashes(prior_prompt, PAGE_SIZE)))
    for url in urls[1:]:
        other = [rng.getrandbits(63) for _ in range(tokens // PAGE_SIZE // 2)]
        index.apply(url, stored(system_pages))
        index.apply(url, stored(other, system_pages[-1] if system_pages else None))
    loads = {url: float(rng.randint(2, 12)) for url in urls}
    loads[urls[0]] = 6.0  # busy but not overloaded: SMetric should stay sticky
    policy = make_policy("smetric")
    # as the router builds it for smetric, which does not read the text (policy.uses_text_tree)
    extractor = FeatureExtractor(codec.chat, page_size=PAGE_SIZE, keep_text=False)

    cold_start = time.perf_counter()
    # the previous turn, which warms the caches
    extractor.from_chat({"messages": prior, "tools": TOOLS})
    cold = time.perf_counter() - cold_start
    stopwatch = codec.stopwatch

    bodies = [
        (
            content,
            orjson.dumps(
                {
                    "model": "m",
                    "messages": prior
                    + follow_up(codec, rng, f"new{i}{content}", new_tokens, content),
                    "tools": TOOLS,
                }
            ),
        )
        for i in range(iterations)
        for content in contents
    ]
    out: dict[str, dict[str, Any]] = {
        c: {
            "history": len(prior_prompt),
            "messages": len(prior) + 2,
            "cold_ms": cold * 1e3,
            "phases": {k: [] for k in ("parse", "extract", "render", "tokenize", "view", "decide")},
            "total": [],
            "new_tokens": [],
        }
        for c in contents
    }
    # the setup's garbage (history, bodies) collected now, not inside the first timed requests;
    # the collections the timed requests cause themselves are timed with them
    gc.collect()
    for tick, (content, raw) in enumerate(bodies):
        t0 = time.perf_counter()
        body = orjson.loads(raw)
        t1 = time.perf_counter()
        stopwatch.take()
        features = extractor.from_chat(body)
        t2 = time.perf_counter()
        inside = stopwatch.take()
        hits = index.match(features.page_hashes, features.page_size)
        view = ClusterView(
            tuple(
                WorkerView(url, loads[url], hit=hits[url][1], gpu_hit=hits[url][0]) for url in urls
            ),
            tick=tick,
        )
        t3 = time.perf_counter()
        decision = policy.decide(features, view)
        t4 = time.perf_counter()
        if (decision.worker, decision.reason) != (urls[0], Reason.STICKY.value):
            raise AssertionError(f"expected a sticky decision to worker 0, got {decision}")
        r = out[content]
        phases = (t1 - t0, t2 - t1, inside["render"], inside["tokenize"], t3 - t2, t4 - t3)
        for name, dt in zip(r["phases"], phases, strict=True):
            r["phases"][name].append(dt)
        r["total"].append(t4 - t1)
        r["pages"] = len(features.page_hashes)
        r["new_tokens"].append(len(codec.encode(body["messages"][-1]["content"])))
    return out


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"{cpu}, {cores} cores available; Python {platform.python_version()}, "
        f"tokenizers {tokenizers.__version__}, {platform.system()} {platform.release()}"
    )


def header(iterations: int) -> str:
    return "\n".join(
        [
            "# Feature extraction + decision time for an agent follow-up",
            "",
            f"Machine: {machine()}.",
            "",
            f"Policy smetric, {WORKERS} workers, page size {PAGE_SIZE}. The previous turn of the "
            "session was already extracted (warm caches) and worker 0 holds its pages; each of "
            f"{iterations} follow-ups per size and kind of content (the kinds alternate) "
            "appends an assistant tool call and a new tool result (fresh content, tokenized "
            "cold) and is re-parsed from JSON so nothing is shared with the previous request; "
            "the body carries one tool definition. Times in microseconds, median / p90. "
            "`total` = extract + view + decide; JSON parsing of the body (the HTTP layer's cost) "
            "is shown for context and not included. Every decision is checked to be sticky to "
            "worker 0.",
            "",
            "Regenerate: `python -m benchmarks.feature_decision --out "
            "benchmarks/results/feature_decision.md` (`--template chatml` or `coder` for one).",
            "",
            "Where the time goes. Extraction renders the chat whole with the model's chat "
            "template, as SGLang does (templates may rewrite earlier turns, so nothing short of "
            "rendering is exact), twice: the prompt, and the conversation through its last "
            "assistant message (est_hit). Both renders reuse the output of the message-loop "
            "iterations an earlier render ran with the same message objects, neighbours and "
            "outside values (features/loop_reuse.py: decided from the template's syntax tree, "
            "exact), so `render` (both renders) is the template's work outside that loop, the "
            "new messages' iterations, and a comparison and a copy that grow with the history "
            "(the prompt's text is still built whole). The follow-up is matched to the previous "
            "request by comparing message lists in C, and only the text after the last special "
            "token before the first changed character is tokenized and hashed. `tokenize` grows "
            "with the size and kind of the new text (random vocabulary "
            "words run together are BPE's slowest input, source code far cheaper). KvIndex.match "
            "binary-searches the prefix length for all 32 workers at once. Load average when this "
            f"run started: {os.getloadavg()[0]:.2f} on 2 cores shared with other jobs (they show "
            "in the p90 column). `decide` does the same work in every row, so it doubling "
            "between rows marks a slower phase of the shared machine; the kinds of content "
            "alternate, so within a size they share it.",
            "",
        ]
    )


CONTENT = {
    "words": "random vocabulary words run together (no spaces: the slowest input for BPE)",
    "source": "whole lines of this repository's Python source (what a coding agent reads)",
}
TEMPLATE_NOTES = {
    "chatml": "the bundled tokenizer's ChatML template (the router's default)",
    "coder": "the tiny model's Qwen3-Coder-style template (tool definitions in the system turn, "
    "tool calls and responses in tags; a macro call and loop look-arounds per message)",
}


def report(results: list[dict[str, Any]], template: str, new_tokens: int, content: str) -> str:
    def us(values: list[float], q: float) -> str:
        return f"{percentile(values, q) * 1e6:.0f}"

    mean = sum(sum(r["new_tokens"]) / len(r["new_tokens"]) for r in results) / len(results)
    lines = [
        f"## {template}: new tool result of {new_tokens} tokens, {content}",
        "",
        f"Template: {TEMPLATE_NOTES[template]}. Content: {CONTENT[content]}; {mean:.0f} tokens "
        "on average.",
        "",
        "| history tokens | messages | pages | **extract** | of which: render (x2) | tokenize "
        "| view (KvIndex.match + view) | decide | total | json parse (not incl.) "
        "| cold first extract (ms) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        p = r["phases"]
        cells = [
            f"{r['history']:,}",
            str(r["messages"]),
            f"{r['pages']:,}",
            f"**{us(p['extract'], 0.5)} / {us(p['extract'], 0.9)}**",
            *(
                f"{us(p[k], 0.5)} / {us(p[k], 0.9)}"
                for k in ("render", "tokenize", "view", "decide")
            ),
            f"{us(r['total'], 0.5)} / {us(r['total'], 0.9)}",
            f"{us(p['parse'], 0.5)} / {us(p['parse'], 0.9)}",
            f"{r['cold_ms']:.0f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", default="1024,32768,131072", help="history tokens, comma-separated"
    )
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument(
        "--new-tokens", default="192,32", help="tokens of the new tool result, comma-separated"
    )
    parser.add_argument(
        "--content",
        default="words,source",
        help=f"what the new tool result holds, comma-separated: {', '.join(CONTENT)}",
    )
    parser.add_argument(
        "--template",
        default="chatml,coder",
        help=f"chat templates, comma-separated: {', '.join(TEMPLATES)}",
    )
    parser.add_argument("--out", type=Path, help="write the markdown report here")
    args = parser.parse_args()
    contents = args.content.split(",")
    for content in contents:
        if content not in CONTENT:
            parser.error(f"--content: unknown {content!r}, expected one of {', '.join(CONTENT)}")
    sections = []
    for template in args.template.split(","):
        if template not in TEMPLATES:
            parser.error(
                f"--template: unknown {template!r}, expected one of {', '.join(TEMPLATES)}"
            )
        codec = Codec(load_chat_tokenizer(None, TEMPLATES[template]))
        for new_tokens in (int(n) for n in args.new_tokens.split(",")):
            by_size = [
                run_size(codec, int(s), args.iterations, new_tokens, contents)
                for s in args.sizes.split(",")
            ]
            sections += [report([r[c] for r in by_size], template, new_tokens, c) for c in contents]
    text = "\n".join([header(args.iterations), *sections])
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
