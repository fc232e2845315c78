"""Golden equality for OpenAI Responses: the router's prompt token ids are SGLang 0.5.23's own.

Runs in the CPU SGLang environment. Each generated Responses body (input as a string or items:
messages of every role with string or part content, developer messages, function_call /
custom_tool_call items and their outputs, reasoning items with summary, content or SGLang's
encrypted blob, unknown item types; instructions; function, custom and built-in tools; every
tool_choice; reasoning.effort) goes through SGLang's own ResponsesRequest and
OpenAIServingResponses._make_request on a stand-in serving object (golden_chat.Sglang's: no
reasoning or tool-call parser, not harmony); the router's FeatureExtractor.responses_chat +
from_chat must give the same ids and page hashes, turn = the assistant messages SGLang's
conversion makes, or refuse what SGLang refuses.

    python golden_responses.py CONFIG [--examples N] [--seed S]

CONFIG as golden_chat.py (bundled, tiny-coder, qwen3-thinking). Prints `RESULT <json>`.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from golden_chat import COLD_PAGE, WARM_PAGE, Golden, name, run_converted_golden, text
from hypothesis import strategies as st
from pydantic import ValidationError
from sglang.srt.entrypoints.openai.protocol import ResponsesRequest
from sglang.srt.entrypoints.openai.responses_adapters import encode_reasoning_state
from sglang.srt.entrypoints.openai.serving_responses import OpenAIServingResponses
from sglang.srt.parser.template_detection import detect_inline_system_support

from smetric_router.features.errors import FeatureError
from smetric_router.features.extract import FeatureExtractor
from smetric_router.features.hashing import page_hashes

args = st.dictionaries(name, st.none() | st.booleans() | st.integers(-99, 99) | text, max_size=3)
in_text = st.builds(lambda t: {"type": "input_text", "text": t}, text)
out_text = st.builds(lambda t: {"type": "output_text", "text": t, "annotations": []}, text)
image = st.sampled_from(
    [
        {"type": "input_image", "image_url": "https://example.com/a.png"},
        {"type": "input_image", "image_url": "https://example.com/b.png", "detail": "low"},
    ]
)


@st.composite
def content(draw: st.DrawFn, parts: st.SearchStrategy[Any]) -> Any:
    if draw(st.booleans()):
        return draw(text)
    return draw(st.lists(parts, min_size=1, max_size=3))


@st.composite
def reasoning(draw: st.DrawFn) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "reasoning", "id": "rs_1", "summary": []}
    kind = draw(st.integers(0, 3))
    if kind == 0:
        item["summary"] = [{"type": "summary_text", "text": draw(text)}]
    elif kind == 1:
        item["content"] = [{"type": "reasoning_text", "text": draw(text)}]
    elif kind == 2:
        item["encrypted_content"] = encode_reasoning_state(draw(text))
    return item


@st.composite
def conversation(draw: st.DrawFn) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    pending: list[tuple[str, bool]] = []
    for turn in range(draw(st.integers(1, 4))):
        for call_id, custom in pending:
            out = draw(st.one_of(text, st.lists(in_text, max_size=2)))
            kind = "custom_tool_call_output" if custom else "function_call_output"
            items.append({"type": kind, "call_id": call_id, "output": out})
        pending = []
        if not items or draw(st.integers(0, 2)):
            role = draw(st.sampled_from(["user", "user", "user", "system", "developer"]))
            msg: dict[str, Any] = {
                "role": role,
                "content": draw(content(st.one_of(in_text, image))),
            }
            if draw(st.booleans()):
                msg["type"] = "message"
            items.append(msg)
        if draw(st.integers(0, 2)) == 0:
            items.append(draw(reasoning()))
        for _ in range(draw(st.sampled_from([0, 1, 1, 2]))):  # two: merged into one turn
            msg = {"role": "assistant", "content": draw(content(out_text))}
            if draw(st.booleans()):
                msg |= {"type": "message", "id": f"msg_{turn}", "status": "completed"}
            if draw(st.integers(0, 5)) == 0:
                msg["phase"] = draw(st.sampled_from(["commentary", "final_answer"]))
            items.append(msg)
        for k in range(draw(st.integers(0, 2))):
            call_id = f"call_{turn}_{k}"
            if draw(st.integers(0, 4)) == 0:
                call = {"type": "custom_tool_call", "call_id": call_id, "name": draw(name),
                        "input": draw(text)}  # fmt: skip
                pending.append((call_id, True))
            else:
                raw = draw(st.one_of(args.map(json.dumps), st.sampled_from(["", "[1]", "{bad"])))
                call = {"type": "function_call", "call_id": call_id, "name": draw(name),
                        "arguments": raw}  # fmt: skip
                pending.append((call_id, False))
            if draw(st.booleans()):
                call["id"] = f"fc_{turn}_{k}"
            items.append(call)
    if draw(st.integers(0, 3)):
        for call_id, custom in pending:
            kind = "custom_tool_call_output" if custom else "function_call_output"
            items.append({"type": kind, "call_id": call_id, "output": draw(text)})
        if not pending or draw(st.booleans()):
            items.append({"role": "user", "content": draw(text)})
    if draw(st.integers(0, 40)) == 17:
        items.insert(draw(st.integers(0, len(items))), {"type": "item_reference", "id": "x"})
    return items


@st.composite
def tool(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["function", "function", "function", "custom", "web_search"]))
    if kind == "web_search":
        return {"type": "web_search"}
    out: dict[str, Any] = {"type": kind, "name": draw(name)}
    if draw(st.booleans()):
        out["description"] = draw(text)
    if kind == "function":
        out["parameters"] = {"type": "object", "properties": {draw(name): {"type": "string"}}}
        if draw(st.booleans()):
            out["strict"] = draw(st.booleans())
    elif draw(st.booleans()):
        out["format"] = {"type": "grammar", "syntax": "lark", "definition": "start: /a+/"}
    return out


@st.composite
def responses_body(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "max_output_tokens": 16}
    body["input"] = draw(text) if draw(st.integers(0, 4)) == 0 else draw(conversation())
    if draw(st.booleans()):
        body["instructions"] = draw(st.one_of(text, st.just("")))
    tools = draw(st.lists(tool(), max_size=3, unique_by=lambda t: t.get("name", t["type"])))
    if tools:
        body["tools"] = tools
    choice = draw(st.sampled_from([None, None, "auto", "none", "required", "named", "web"]))
    if choice == "named":
        names = [t["name"] for t in tools if "name" in t] or ["missing"]
        body["tool_choice"] = {"type": "function", "name": draw(st.sampled_from(names))}
    elif choice == "web":
        body["tool_choice"] = {"type": "web_search"}
    elif choice is not None:
        body["tool_choice"] = choice
    if draw(st.integers(0, 4)) == 0:
        body["reasoning"] = {"effort": draw(st.sampled_from(["none", "low", "high"]))}
    if draw(st.integers(0, 4)) == 0:
        body["stream"] = True
    return body


class GoldenResponses:
    def __init__(self, config: str) -> None:
        self.golden = Golden(config)
        chat = self.golden.sglang.serving
        s = object.__new__(OpenAIServingResponses)
        s.__dict__.update(chat.__dict__)
        # as OpenAIServingChat.__init__ decides it for a Jinja template
        s.supports_inline_system = detect_inline_system_support(
            self.golden.sglang.tok.chat_template
        )
        s._template_reads_reasoning_content = False
        s.use_harmony = s._translates_tools = False
        s.msg_store = {}
        chat.tokenizer_manager.model_config.is_multimodal = False
        # a text model's worker refuses images (its 400, not the router's): render them anyway
        s._validate_media_content = lambda request: None
        self.serving = s
        self.examples = self.requests = self.refused = 0
        self.reasons: Counter[str] = Counter()
        self.inline = s.supports_inline_system

    def sglang_ids(self, body: dict[str, Any]) -> list[int]:
        """ValueError when SGLang refuses the body (its 400s)."""
        try:
            request = ResponsesRequest.model_validate(json.loads(json.dumps(body)))
        except ValidationError as e:
            raise ValueError(str(e)) from e
        tok = self.golden.sglang.tok
        try:
            _, _, prompts, _ = asyncio.run(self.serving._make_request(request, None, tok))
        except ValidationError as e:
            raise ValueError(str(e)) from e
        return list(prompts[0])

    def check(self, body: dict[str, Any]) -> None:
        self.examples += 1
        self.requests += 1
        warm = self.golden.warm
        try:
            want = self.sglang_ids(body)
        except (ValueError, TypeError) as e:
            self.refused += 1
            self.reasons[str(e)[:60]] += 1
            try:
                warm.from_chat(warm.responses_chat(body))
            except FeatureError:
                return
            raise AssertionError(f"SGLang refused ({e}) what the router accepted") from e
        chat = warm.responses_chat(body)
        f = warm.from_chat(chat)
        ids = warm.prompt_token_ids(chat)
        assert ids == want, ("ids differ", body, chat, ids, want)
        assert list(f.page_hashes) == page_hashes(want, WARM_PAGE)
        assert f.turn == sum(m["role"] == "assistant" for m in chat["messages"])
        cold = FeatureExtractor(self.golden.chat, page_size=COLD_PAGE)
        got = cold.from_chat(cold.responses_chat(body))
        assert list(got.page_hashes) == page_hashes(want, COLD_PAGE)


def main() -> None:
    run_converted_golden(GoldenResponses, responses_body())


if __name__ == "__main__":
    main()
