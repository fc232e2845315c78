"""Golden equality: the router's prompt token ids are SGLang 0.5.23's own, byte for byte.

Runs in the CPU SGLang environment (.venv-sglang), where the truth is SGLang's and transformers'
own code: each generated chat request goes through pydantic's ChatCompletionRequest and SGLang's
OpenAIServingChat._process_messages (message preprocessing, tools, template kwargs, the render
and its encoding), whose calls to tokenizer.apply_chat_template are recorded and repeated with
tokenize=True, add_generation_prompt=True as transformers tokenizes. The router's
FeatureExtractor (one long-lived instance, so follow-ups take its incremental path, and a fresh
one for each full conversation) must give the same ids and page hashes, and its est_hit must be
the documented history rule checked with the HF tokenizer. Raw text prompts are checked against
the tokenizer call SGLang's tokenizer manager makes for /generate and /v1/completions.

    python golden_chat.py CONFIG... [--examples N] [--seed S]

CONFIG: bundled (the bundled tokenizer and its ChatML template), tiny-coder (the tiny model's
Qwen3-Coder-style template), qwen3-thinking (tests/features/templates/qwen3_thinking.jinja given
as --chat-template: it strips reasoning from earlier turns). Prints `RESULT <json>`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
import traceback
from collections import Counter, OrderedDict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from smetric_router.sglang_cpu import install

install()

from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest  # noqa: E402
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat  # noqa: E402
from sglang.srt.parser.template_manager import TemplateManager  # noqa: E402
from sglang.srt.utils.hf_transformers_utils import get_tokenizer  # noqa: E402

from smetric_router.features.chat_tokenizer import load_chat_tokenizer  # noqa: E402
from smetric_router.features.extract import FeatureExtractor  # noqa: E402
from smetric_router.features.hashing import page_hashes  # noqa: E402
from smetric_router.launch.tiny_model import ensure_tiny_model  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
BUNDLED = REPO / "smetric_router" / "assets" / "tokenizer"
THINKING = REPO / "tests" / "features" / "templates" / "qwen3_thinking.jinja"
WARM_PAGE, COLD_PAGE = 4, 16


# --- SGLang's side --------------------------------------------------------------------------


class Sglang:
    """SGLang's chat preprocessing and tokenization on a stand-in OpenAIServingChat: the real
    methods, given the attributes its __init__ would set for a text model with no reasoning or
    tool-call parser."""

    def __init__(self, model_path: str, chat_template: str | None) -> None:
        self.tok = get_tokenizer(model_path)
        manager = SimpleNamespace(
            tokenizer=self.tok,
            processor=None,
            model_config=SimpleNamespace(hf_config=SimpleNamespace(architectures=["Qwen3"])),
        )
        self.templates = TemplateManager()
        self.templates.load_chat_template(manager, chat_template, model_path)
        assert self.templates.chat_template_name is None, "expected a Jinja template"
        s = object.__new__(OpenAIServingChat)
        s.template_manager = self.templates
        s.tokenizer_manager = manager
        s.tool_call_parser = s.reasoning_parser = None
        s.default_chat_template_kwargs = {}
        s._reasoning_detector = None
        s.is_gpt_oss = s.is_gemma4 = s.is_minimax_m3 = False
        s.chat_encoding_spec = s._encoding_adapter = None
        s.supports_inline_system = False
        s._tokenizer_auto_adds_specials = len(self.tok.encode("")) > 0
        s._prompt_text_round_trip_is_lossy = OpenAIServingChat._probe_prompt_text_round_trip(s)
        s._chat_template_cache = OrderedDict()
        self.serving = s
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any], Any]] = []
        original = self.tok.apply_chat_template

        def recorded(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            self.calls.append((args, kwargs, out))
            return out

        self.tok.apply_chat_template = recorded
        self._original = original
        added = [t for t in self.tok.added_tokens_decoder.values() if not t.normalized]
        alternatives = sorted({t.content for t in added}, key=len, reverse=True)
        self.added = re.compile("|".join(re.escape(a) for a in alternatives))

    def prompt(self, body: dict[str, Any], generation_prompt: bool = True) -> tuple[list[int], str]:
        """(prompt ids, rendered text) as SGLang makes them; with generation_prompt=False, the
        rendering SGLang's format path makes (no final-turn handling, no generation prompt)."""
        request = ChatCompletionRequest.model_validate(json.loads(json.dumps(body)))
        if not generation_prompt:
            request._format_add_generation_prompt = False
        self.calls.clear()
        result = self.serving._process_messages(request, is_multimodal=False)
        (args, kwargs, rendered) = self.calls[-1]
        assert kwargs["tokenize"] is False and isinstance(rendered, str)
        ids = list(result.prompt_ids)
        if generation_prompt and not body.get("continue_final_message"):
            again = {k: v for k, v in kwargs.items() if k not in ("tokenize", "return_dict")}
            whole = self._original(*args, tokenize=True, return_dict=False, **again)
            assert list(whole) == ids, ("apply_chat_template(tokenize=True) differs", whole, ids)
        return ids, rendered

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def text_prompt(self, text: str) -> list[int]:
        """The tokenizer call of SGLang's tokenizer manager for a /generate text prompt."""
        return list(self.tok([text])["input_ids"][0])

    def history_ids(self, prompt: str, shown: str) -> int:
        """The documented est_hit rule, with the HF tokenizer: ids of the prompt up to the last
        added-token end within the text it shares with the history's rendering."""
        common = 0
        for a, b in zip(prompt, shown, strict=False):
            if a != b:
                break
            common += 1
        ends = [m.end() for m in self.added.finditer(prompt) if m.end() <= common]
        return len(self.encode(prompt[: ends[-1]])) if ends else 0


# --- generated requests ---------------------------------------------------------------------

PIECES = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>", "<think>",
    "</think>", "<tool_response>", "</tool_response>", "\n", "\n\n", " ", "  ", "\t", "    ",
    "\r\n", "def f(x):\n    return x\n", "é", "ü", "中文", "✓", "🙂", "\u00a0", "{", "}", '"',
    "'s", "read", " file", " the", "123", "3.14", "<", ">", "/", "assistant", "user\n",
]  # fmt: skip
fragment = st.one_of(
    st.sampled_from(PIECES),
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12),
)
text = st.lists(fragment, max_size=8).map("".join)
name = st.from_regex(r"[a-z][a-z_]{0,8}", fullmatch=True)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(name, inner, max_size=3),
    max_leaves=6,
)  # fmt: skip


@st.composite
def tool(draw: st.DrawFn) -> dict[str, Any]:
    props = draw(st.dictionaries(name, st.fixed_dictionaries(
        {"type": st.sampled_from(["string", "integer", "object", "array"])},
        optional={"description": text},
    ), max_size=3))  # fmt: skip
    fields: dict[str, Any] = {"name": draw(name)}
    if draw(st.booleans()):
        fields["description"] = draw(text)
    if draw(st.booleans()):
        fields["parameters"] = {"type": "object", "properties": props}
    if draw(st.integers(0, 4)) == 0:
        fields["strict"] = draw(st.booleans())
    keys = draw(st.permutations(list(fields)))
    return {"type": "function", "function": {k: fields[k] for k in keys}}


def parts(content: st.SearchStrategy[Any], media: bool) -> st.SearchStrategy[Any]:
    part = st.builds(lambda t: {"type": "text", "text": t}, text)
    if media:
        image = st.just({"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}})
        part = st.one_of(part, part, image)
    return st.one_of(content, st.lists(part, max_size=3))


@st.composite
def conversation(draw: st.DrawFn) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(text)})
    pending: list[str] = []
    for turn in range(draw(st.integers(1, 4))):
        if pending:
            for call_id in pending:
                content = draw(parts(text, media=False))
                messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
            pending = []
        if not messages or messages[-1]["role"] != "tool" or draw(st.booleans()):
            role = draw(st.sampled_from(["user"] * 9 + ["developer"]))
            messages.append({"role": role, "content": draw(parts(text, media=role == "user"))})
        reply: dict[str, Any] = {"role": "assistant", "content": draw(st.none() | text)}
        if draw(st.booleans()):
            reply["reasoning_content"] = draw(text)
        if draw(st.booleans()):
            calls = []
            for k in range(draw(st.integers(1, 2))):
                args = draw(st.dictionaries(name, json_value, max_size=3))
                call_id = f"call_{turn}_{k}"
                encoded = json.dumps(args) if draw(st.integers(0, 3)) else args
                calls.append({"id": call_id, "type": "function",
                              "function": {"name": draw(name), "arguments": encoded}})  # fmt: skip
                pending.append(call_id)
            reply["tool_calls"] = calls
        messages.append(reply)
    if not draw(st.integers(0, 4)):
        return messages  # ends with an assistant turn
    for call_id in pending:
        messages.append({"role": "tool", "tool_call_id": call_id, "content": draw(text)})
    if not pending or draw(st.booleans()):
        messages.append({"role": "user", "content": draw(text)})
    return messages


@st.composite
def chat_body(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "messages": draw(conversation())}
    tools = draw(st.lists(tool(), max_size=3, unique_by=lambda t: t["function"]["name"]))
    if bool(tools) or draw(st.booleans()):
        body["tools"] = tools
    choice = draw(st.sampled_from([None, None, "auto", "none", "named"]))
    if choice == "named" and tools:
        chosen = tools[-1]["function"]["name"]
        body["tool_choice"] = {"type": "function", "function": {"name": chosen}}
    elif choice not in (None, "named"):
        body["tool_choice"] = choice
    if draw(st.integers(0, 3)) == 0:
        body["chat_template_kwargs"] = {"enable_thinking": draw(st.booleans())}
    if draw(st.integers(0, 5)) == 0:
        body["reasoning_effort"] = draw(st.sampled_from(["none", "low", "high"]))
    if body["messages"][-1]["role"] == "assistant" and draw(st.integers(0, 2)) == 0:
        body["continue_final_message"] = True
    return body


def requests_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Earlier turns of the conversation (prefixes a client would have sent), then the body."""
    messages = body["messages"]
    cuts = [k for k in range(1, len(messages)) if messages[k]["role"] == "assistant"]
    base = {k: v for k, v in body.items() if k != "continue_final_message"}
    earlier = [base | {"messages": messages[:k]} for k in cuts[-2:]]
    return [*earlier, body]


# --- the checks -----------------------------------------------------------------------------


class Golden:
    def __init__(self, config: str) -> None:
        if config == "bundled":
            model, template, router_template = str(BUNDLED), None, None
        elif config == "tiny-coder":
            model = str(ensure_tiny_model(Path(tempfile.mkdtemp()) / "tiny"))
            template = router_template = None
        elif config == "qwen3-thinking":
            model, template, router_template = str(BUNDLED), str(THINKING), str(THINKING)
        else:
            raise SystemExit(f"unknown config {config}")
        self.sglang = Sglang(model, template)
        self.chat = load_chat_tokenizer(model, router_template)
        sglang_format = self.sglang.templates.jinja_template_content_format
        assert self.chat.traits.content_format == sglang_format, sglang_format
        self.warm = FeatureExtractor(self.chat, page_size=WARM_PAGE, cache_entries=64)
        self.examples = self.requests = self.raw = self.errors = 0
        self.reasons: Counter[str] = Counter()

    def check_chat(self, body: dict[str, Any]) -> None:
        self.examples += 1
        cold = FeatureExtractor(self.chat, page_size=COLD_PAGE)
        for request in requests_of(body):
            self.requests += 1
            try:
                want, prompt = self.sglang.prompt(request)
            except ValueError as e:  # SGLang refuses the request: so must the router
                self.errors += 1
                self.reasons[str(e)[:60]] += 1
                try:
                    self.warm.from_chat(request)
                except ValueError:
                    continue
                raise AssertionError(f"SGLang refused ({e}) what the router accepted") from e
            f = self.warm.from_chat(request)
            ids = self.warm.prompt_token_ids(request)
            assert ids == want, ("ids differ", request, prompt, ids, want)
            assert f.prompt_len == len(want)
            assert list(f.page_hashes) == page_hashes(want, WARM_PAGE)
            messages = request["messages"]
            assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
            assert f.turn == len(assistants)
            history = 0
            if assistants:
                shown_body = request | {"messages": messages[: assistants[-1] + 1]}
                shown_body.pop("continue_final_message", None)
                _, shown = self.sglang.prompt(shown_body, generation_prompt=False)
                history = self.sglang.history_ids(prompt, shown)
                assert want[:history] == self.sglang.encode(prompt)[:history]
            assert f.est_hit == history, ("est_hit", request, f.est_hit, history)
            if request is body:  # the whole conversation, cold
                assert list(cold.from_chat(body).page_hashes) == page_hashes(want, COLD_PAGE)
                assert cold.prompt_token_ids(body) == want

    def check_text(self, prompt: str) -> None:
        self.raw += 1
        want = self.sglang.text_prompt(prompt)
        assert self.warm.prompt_token_ids({"text": prompt}) == want
        assert self.warm.prompt_token_ids({"prompt": prompt}) == want
        f = self.warm.from_generate({"text": prompt})
        assert (f.prompt_len, list(f.page_hashes)) == (len(want), page_hashes(want, WARM_PAGE))


def check_chat_config(config: str, examples: int, seed_value: int) -> dict[str, Any]:
    golden = Golden(config)
    common = settings(
        max_examples=examples, deadline=None, database=None, print_blob=True,
        suppress_health_check=list(HealthCheck),
    )  # fmt: skip
    start = time.perf_counter()
    failure = None
    try:

        @seed(seed_value)
        @common
        @given(chat_body())
        def chats(body: dict[str, Any]) -> None:
            golden.check_chat(body)

        @seed(seed_value)
        @common
        @given(text)
        def texts(prompt: str) -> None:
            golden.check_text(prompt)

        chats()
        texts()
    except Exception:
        failure = traceback.format_exc()[-6000:]
    return {
        "config": config,
        "ok": failure is None,
        "examples": golden.examples,
        "requests": golden.requests,
        "refused": golden.errors,
        "refusals": dict(golden.reasons.most_common(5)),
        "text_prompts": golden.raw,
        "seconds": round(time.perf_counter() - start, 1),
        "failure": failure,
        **getattr(golden, "extra", {}),
    }


def each_config(default_seed: int, default_examples: int) -> tuple[list[str], int, int]:
    """The command line every golden script takes: CONFIG... [--examples N] [--seed S]. Several
    configurations run in one process, which pays SGLang's import once."""
    p = argparse.ArgumentParser()
    p.add_argument("configs", nargs="+")
    p.add_argument("--examples", type=int, default=default_examples)
    p.add_argument("--seed", type=int, default=default_seed)
    a = p.parse_args()
    return a.configs, a.examples, a.seed


def report(out: dict[str, Any]) -> None:
    print("RESULT " + json.dumps(out))
    sys.stdout.flush()


def main() -> None:
    configs, examples, seed_value = each_config(20261130, 1000)
    for config in configs:
        report(check_chat_config(config, examples, seed_value))


def check_converted_config(
    make: Any, bodies_of: Any, config: str, examples: int, seed_value: int
) -> dict[str, Any]:
    golden = make(config)
    start = time.perf_counter()
    failure = None
    try:

        @seed(seed_value)
        @settings(max_examples=examples, deadline=None, database=None, print_blob=True,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(bodies_of)
        def bodies(body: dict[str, Any]) -> None:
            golden.check(body)

        bodies()
    except Exception:
        failure = traceback.format_exc()[-6000:]
    return {
        "config": config,
        "ok": failure is None,
        "inline_system": golden.inline,
        "examples": golden.examples,
        "requests": golden.requests,
        "refused": golden.refused,
        "refusals": dict(golden.reasons.most_common(6)),
        "seconds": round(time.perf_counter() - start, 1),
        "failure": failure,
        **getattr(golden, "extra", {}),
    }


def run_converted_golden(make: Any, bodies_of: Any) -> None:
    """main() of the scripts for APIs SGLang converts to chat (golden_messages, golden_responses):
    `make(config)` builds the checker (check(body), examples, requests, refused, reasons,
    inline), `bodies_of` is the hypothesis strategy of request bodies."""
    configs, examples, seed_value = each_config(20261201, 500)
    for config in configs:
        report(check_converted_config(make, bodies_of, config, examples, seed_value))


if __name__ == "__main__":
    main()
