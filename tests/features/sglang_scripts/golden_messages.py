"""Golden equality for Anthropic Messages: the router's prompt token ids are SGLang 0.5.23's own.

Runs in the CPU SGLang environment. Each generated Messages body (system as a string or blocks,
inline system messages, text / image / search_result / thinking / redacted_thinking blocks,
tool_use and tool_result chains with string, block, image and tool_reference results, custom and
server tools with and without defer_loading, every tool_choice, output_config.effort, and the
fields Claude Code adds: thinking, context_management, metadata, betas, cache_control) goes
through SGLang's own
AnthropicMessagesRequest and AnthropicServing._convert_to_chat_completion_request on a stand-in
OpenAIServingChat (golden_chat.Sglang: no reasoning or tool-call parser) and its
_process_messages; the router's FeatureExtractor.messages_chat + from_chat must give the same
ids and page hashes, turn = the assistant messages, or refuse what SGLang refuses. The body
compared is the one the router forwards by default (--anthropic-thinking drop: a reasoning
`thinking` and clear_thinking edits removed); SGLang must refuse the body as it came whenever
that removed a reasoning `thinking` (what --anthropic-thinking reject passes on).

    python golden_messages.py CONFIG [--examples N] [--seed S]

CONFIG as golden_chat.py (bundled, tiny-coder, qwen3-thinking). Prints `RESULT <json>`.
"""

from __future__ import annotations

import json
import logging
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from golden_chat import COLD_PAGE, WARM_PAGE, Golden, name, run_converted_golden, text
from hypothesis import strategies as st
from pydantic import ValidationError
from sglang.srt.entrypoints.anthropic.protocol import AnthropicMessagesRequest
from sglang.srt.entrypoints.anthropic.serving import AnthropicServing
from sglang.srt.parser.template_detection import detect_inline_system_support

from smetric_router.features import anthropic_thinking
from smetric_router.features.errors import FeatureError
from smetric_router.features.extract import FeatureExtractor
from smetric_router.features.hashing import page_hashes

# SGLang warns each time it drops a thinking block (no reasoning parser): expected here
logging.getLogger("sglang.srt.entrypoints.anthropic.serving").setLevel(logging.ERROR)

args = st.dictionaries(name, st.none() | st.booleans() | st.integers(-99, 99) | text, max_size=3)
image = st.sampled_from(
    [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
        {"type": "image", "source": {"type": "base64", "data": ""}},
    ]
)
search = st.builds(
    lambda t, s, c: {"type": "search_result", "title": t, "source": s,
                     "content": [{"type": "text", "text": c}]},
    text, st.sampled_from(["https://a.example", "", "doc"]), text,
)  # fmt: skip
text_block = st.builds(lambda t: {"type": "text", "text": t}, text)


@st.composite
def tool_result(draw: st.DrawFn, call_id: str) -> dict[str, Any]:
    inner = st.one_of(
        text_block,
        text_block,
        image,
        search,
        st.builds(lambda n: {"type": "tool_reference", "tool_name": n}, name),
    )
    content = draw(st.one_of(st.none(), text, st.lists(inner, max_size=4)))
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id}
    if content is not None:
        block["content"] = content
    if draw(st.booleans()):
        block["is_error"] = draw(st.booleans())
    return block


@st.composite
def conversation(draw: st.DrawFn) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    pending: list[str] = []
    for turn in range(draw(st.integers(1, 4))):
        user: list[Any] = [draw(tool_result(c)) for c in pending]
        pending = []
        extra = st.one_of(text_block, text_block, image, search)
        user[draw(st.integers(0, len(user))) : 0] = draw(st.lists(extra, max_size=2))
        if not user or draw(st.integers(0, 5)) == 0:
            messages.append({"role": "user", "content": draw(text)})
        else:
            messages.append({"role": "user", "content": user})
        if draw(st.integers(0, 6)) == 0:
            system = draw(st.one_of(text, st.lists(text_block, min_size=1, max_size=2)))
            messages.append({"role": "system", "content": system})
            messages.append({"role": "user", "content": draw(text)})
        reply: list[Any] = []
        if draw(st.integers(0, 2)) == 0:
            reply.append({"type": "thinking", "thinking": draw(text), "signature": "sig"})
        if draw(st.integers(0, 30)) == 0:
            reply.append({"type": "redacted_thinking", "data": "xx"})
        reply += draw(st.lists(text_block, max_size=2))
        if draw(st.integers(0, 8)) == 0:
            reply.append(draw(tool_result("call_x")))
        for k in range(draw(st.integers(0, 2))):
            call_id = f"toolu_{turn}_{k}"
            call = {"type": "tool_use", "id": call_id, "name": draw(name), "input": draw(args)}
            reply.append(call)
            pending.append(call_id)
        if draw(st.integers(0, 5)) == 0:
            messages.append({"role": "assistant", "content": draw(text)})
        else:
            messages.append({"role": "assistant", "content": reply})
    if draw(st.integers(0, 4)):  # else: ends with the assistant turn
        final: list[Any] = [draw(tool_result(c)) for c in pending]
        if not final or draw(st.booleans()):
            final.append(draw(text_block))
        messages.append({"role": "user", "content": final})
    return messages


@st.composite
def tool(draw: st.DrawFn) -> dict[str, Any]:
    if draw(st.integers(0, 6)) == 0:
        return draw(
            st.sampled_from(
                [
                    {"type": "web_search_20250305", "name": "web_search"},
                    {"type": "bash_20250124", "name": "bash"},
                ]
            )
        )
    schema: dict[str, Any] = {"properties": {draw(name): {"type": "string"}}}
    if draw(st.booleans()):
        schema = {"type": "object", **schema}
    out: dict[str, Any] = {"name": draw(name), "input_schema": schema}
    if draw(st.booleans()):
        out["description"] = draw(text)
    if draw(st.integers(0, 3)) == 0:
        out["type"] = "custom"
    if draw(st.integers(0, 4)) == 0:
        out["defer_loading"] = draw(st.booleans())
    if draw(st.integers(0, 4)) == 0:
        out["strict"] = draw(st.booleans())
    return out


@st.composite
def messages_body(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "max_tokens": 16, "messages": draw(conversation())}
    system = draw(
        st.one_of(st.none(), text, st.lists(st.one_of(text_block, image), min_size=1, max_size=3))
    )
    if system is not None:
        body["system"] = system
    tools = draw(st.lists(tool(), max_size=3, unique_by=lambda t: t["name"]))
    if tools:
        body["tools"] = tools
    choice = draw(st.sampled_from([None, None, "auto", "any", "none", "tool"]))
    if choice == "tool":
        names = [t["name"] for t in tools] or ["missing"]
        body["tool_choice"] = {"type": "tool", "name": draw(st.sampled_from(names))}
    elif choice is not None:
        body["tool_choice"] = {"type": choice}
    if draw(st.integers(0, 5)) == 0:
        body["output_config"] = {"effort": draw(st.sampled_from(["low", "high", "xhigh"]))}
    if draw(st.integers(0, 4)) == 0:
        body["stream"] = True
    claude_code(draw, body)
    return body


def claude_code(draw: st.DrawFn, body: dict[str, Any]) -> None:
    """The fields Claude Code sends on top (read off Claude Code 2.1.332's requests)."""
    thinking = draw(
        st.sampled_from(
            [
                None,
                {"type": "adaptive"},
                {"type": "adaptive", "display": "omitted"},
                {"type": "enabled", "budget_tokens": 2048},
                {"type": "disabled"},
            ]
        )
    )
    if thinking is not None:
        body["thinking"] = thinking
    edits = draw(
        st.lists(
            st.sampled_from(
                [
                    {"type": "clear_thinking_20251015", "keep": "all"},
                    {"type": "clear_tool_uses_20250919"},
                ]
            ),
            max_size=2,
        )
    )
    if bool(edits) or draw(st.booleans()):
        body["context_management"] = {"edits": edits}
    if draw(st.booleans()):
        body["metadata"] = {"user_id": json.dumps({"session_id": draw(name)})}
    if draw(st.integers(0, 3)) == 0:
        body["betas"] = ["interleaved-thinking-2025-05-14", "context-management-2025-06-27"]
    system = body.get("system")
    if isinstance(system, list) and system and draw(st.booleans()):
        system[-1] = {**system[-1], "cache_control": {"type": "ephemeral"}}


def earlier(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The earlier requests of the session (through each assistant turn's user message), then
    the body: follow-ups take the extractor's incremental path."""
    messages = body["messages"]
    cuts = [k for k in range(1, len(messages)) if messages[k]["role"] == "assistant"]
    return [*(body | {"messages": messages[:k]} for k in cuts[-2:]), body]


class GoldenMessages:
    def __init__(self, config: str) -> None:
        self.golden = Golden(config)
        serving = self.golden.sglang.serving
        # as OpenAIServingChat.__init__ decides it for a Jinja template
        serving.supports_inline_system = detect_inline_system_support(
            self.golden.sglang.tok.chat_template
        )
        serving._template_reads_reasoning_content = False
        self.anthropic = AnthropicServing(serving)
        self.examples = self.requests = self.refused = 0
        self.thinking_dropped = self.thinking_refused = 0
        self.reasons: Counter[str] = Counter()
        self.inline = serving.supports_inline_system

    @property
    def extra(self) -> dict[str, int]:
        return {
            "thinking_dropped": self.thinking_dropped,
            "thinking_refused": self.thinking_refused,
        }

    def check_refused_thinking(self, sent: dict[str, Any], forwarded: dict[str, Any]) -> None:
        """Where SGLang serves the forwarded body, it refuses the body as sent (its thinking)."""
        try:
            self.sglang_ids(forwarded)
        except ValueError:
            return  # refused for another reason as well
        self.thinking_dropped += 1
        try:
            self.sglang_ids(sent)
        except ValueError as e:
            assert anthropic_thinking.REFUSAL in str(e), e
            self.thinking_refused += 1
            return
        raise AssertionError(f"SGLang served a reasoning thinking without a parser: {sent}")

    def sglang_ids(self, body: dict[str, Any]) -> list[int]:
        """ValueError when SGLang refuses the body (its 400s)."""
        try:
            request = AnthropicMessagesRequest.model_validate(json.loads(json.dumps(body)))
        except ValidationError as e:
            raise ValueError(str(e)) from e
        chat = self.anthropic._convert_to_chat_completion_request(request)
        result = self.golden.sglang.serving._process_messages(chat, is_multimodal=False)
        return list(result.prompt_ids)

    def check(self, sent: dict[str, Any]) -> None:
        self.examples += 1
        warm = self.golden.warm
        body = json.loads(json.dumps(sent))
        if anthropic_thinking.THINKING in anthropic_thinking.drop_thinking(body):
            self.check_refused_thinking(sent, body)
        for request in earlier(body):
            self.requests += 1
            try:
                want = self.sglang_ids(request)
            except ValueError as e:
                self.refused += 1
                self.reasons[str(e)[:60]] += 1
                try:
                    warm.from_chat(warm.messages_chat(request))
                except FeatureError:
                    continue
                raise AssertionError(f"SGLang refused ({e}) what the router accepted") from e
            chat = warm.messages_chat(request)
            f = warm.from_chat(chat)
            ids = warm.prompt_token_ids(chat)
            assert ids == want, ("ids differ", request, chat, ids, want)
            assert list(f.page_hashes) == page_hashes(want, WARM_PAGE)
            assistants = sum(m["role"] == "assistant" for m in request["messages"])
            assert f.turn == assistants, (f.turn, assistants)
            if request is body:
                cold = FeatureExtractor(self.golden.chat, page_size=COLD_PAGE)
                got = cold.from_chat(cold.messages_chat(body))
                assert list(got.page_hashes) == page_hashes(want, COLD_PAGE)


def main() -> None:
    run_converted_golden(GoldenMessages, messages_body())


if __name__ == "__main__":
    main()
