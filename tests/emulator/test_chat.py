"""The emulator's chat rendering and tokenization, checked over HTTP against transformers itself
(tests/emulator/reference.py), without SGLang (test_chat_golden.py checks SGLang's own code)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from smetric_router.emulator.__main__ import config_from_args, parse_args
from smetric_router.emulator.chat_template import content_format
from smetric_router.emulator.tokenizer import DEFAULT_TOKENIZER_DIR, load_tokenizer
from smetric_router.launch.tiny_model import TEMPLATE
from tests.emulator.conftest import MODEL, PAGE, Worker, make_config, serving
from tests.emulator.reference import ReferenceTokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the repository.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "relative path"}},
                "required": ["path"],
            },
        },
    }
]


@pytest.fixture
async def qwen() -> AsyncIterator[Worker]:
    """A worker given the Qwen3-Coder-style template as --chat-template."""
    async with serving(make_config(chat_template=str(TEMPLATE))) as w:
        yield w


def _reference_with_template() -> ReferenceTokenizer:
    return ReferenceTokenizer(chat_template=TEMPLATE.read_text(encoding="utf-8"))


async def _prompt_tokens(worker: Worker, body: dict[str, Any]) -> int:
    status, out = await worker.post(
        "/v1/chat/completions", {"model": MODEL, "max_tokens": 2, **body}
    )
    assert status == 200, out
    return int(out["usage"]["prompt_tokens"])


async def test_whole_string_tokenization(worker: Worker) -> None:
    """Content that starts with whitespace merges with the newline before it, as one string
    encodes: `"  x"` after the role line is not the tokens of `"  x"` alone."""
    messages = [{"role": "user", "content": "  x"}, {"role": "user", "content": "\n    indented"}]
    expected = worker.codec.render_messages(messages)
    assert await _prompt_tokens(worker, {"messages": messages}) == len(expected)
    piecewise = [*worker.codec.encode("<|im_start|>user\n"), *worker.codec.encode("  x")]
    assert expected[: len(piecewise)] != piecewise  # the template's string, not its pieces


async def test_agent_request_with_the_model_template(qwen: Worker) -> None:
    """Tools in the system turn, tool calls with JSON-string arguments (parsed to objects, as
    SGLang does), tool results in tags: the prompt is transformers' rendering of exactly that."""
    call = {"id": "c1", "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "src/main.py"}'}}  # fmt: skip
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Open the main module."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "\n    def main():\n        pass\n"},
    ]
    parsed_call = {**call, "function": {"name": "read_file", "arguments": {"path": "src/main.py"}}}
    as_sglang = [*messages[:2], {"role": "assistant", "content": "", "tool_calls": [parsed_call]},
                 messages[3]]  # fmt: skip
    expected = _reference_with_template().render_messages(as_sglang, tools=TOOLS)
    assert await _prompt_tokens(qwen, {"messages": messages, "tools": TOOLS}) == len(expected)
    # tool_choice "none": the template sees no tools
    without = _reference_with_template().render_messages(as_sglang)
    body = {"messages": messages, "tools": TOOLS, "tool_choice": "none"}
    assert await _prompt_tokens(qwen, body) == len(without) < len(expected)


async def test_follow_up_hits_the_history_with_the_model_template(qwen: Worker) -> None:
    turn1 = [{"role": "system", "content": "You are a careful coding agent. " * 8},
             {"role": "user", "content": "List the files in the repository."}]  # fmt: skip
    body1 = {"model": MODEL, "messages": turn1, "max_tokens": 30, "tools": TOOLS}
    _, out1 = await qwen.post("/v1/chat/completions", body1)
    answer = out1["choices"][0]["message"]["content"]
    turn2 = [*turn1, {"role": "assistant", "content": answer}, {"role": "user", "content": "Go."}]
    body = {"model": MODEL, "messages": turn2, "max_tokens": 2, "tools": TOOLS}
    _, out2 = await qwen.post("/v1/chat/completions", body)
    history = out1["usage"]["prompt_tokens"] + 30  # prompt, answer text, end of turn
    cached = out2["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= (history - 1) // PAGE * PAGE


async def test_trailing_assistant_turn_is_rendered_as_sglang_does(worker: Worker) -> None:
    """A last assistant message is re-rolled as a user message; with continue_final_message its
    text is appended after the generation prompt instead."""
    messages = [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi"}]
    rerolled = [messages[0], {"role": "user", "content": "Hi"}]
    ref = worker.codec
    assert await _prompt_tokens(worker, {"messages": messages}) == len(
        ref.render_messages(rerolled)
    )
    continued = len(ref.render_messages(messages[:1])) + len(ref.prompt_ids("Hi"))
    body = {"messages": messages, "continue_final_message": True}
    assert await _prompt_tokens(worker, body) == continued


async def test_text_prompts_are_tokenized_as_sglang_does(worker: Worker) -> None:
    text = "  leading spaces, <|im_start|> a special token, and unicode: 你好"
    status, out = await worker.post(
        "/generate", {"text": text, "sampling_params": {"max_new_tokens": 1}}
    )
    assert status == 200, out
    assert out["meta_info"]["prompt_tokens"] == len(worker.codec.prompt_ids(text))


@pytest.mark.parametrize(
    ("message", "error"),
    [
        ({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{no"}}]},
         "Assistant tool call function.arguments must be valid JSON."),
        ({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]},
         "Assistant tool call function.arguments must be a JSON object."),
        ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://i"}}]},
         "Model only supports text input; received unsupported content type 'image_url'."),
    ],
)  # fmt: skip
async def test_requests_sglang_refuses(worker: Worker, message: dict[str, Any], error: str) -> None:
    messages = [{"role": "user", "content": "x"}, message, {"role": "user", "content": "y"}]
    status, out = await worker.post("/v1/chat/completions", {"model": MODEL, "messages": messages})
    assert status == 400 and out["message"] == error


async def test_refused_shapes_are_validation_errors(worker: Worker) -> None:
    for messages in ([{"role": "User", "content": "x"}], [{"role": "user", "content": None}]):
        status, out = await worker.post("/v1/chat/completions", {"messages": messages})
        assert status == 400 and out["type"] == "Bad Request", out


async def test_template_errors(tmp_path: Path) -> None:
    """A template's own exception (raise_exception) is the client's 400; any other failure in
    rendering is SGLang's 500 "Internal server error"."""
    raising = tmp_path / "raising.jinja"
    raising.write_text("{{ raise_exception('only user turns') }}")
    broken = tmp_path / "broken.jinja"
    broken.write_text("{{ 1 // 0 }}")
    body = {"messages": [{"role": "user", "content": "x"}]}
    async with serving(make_config(chat_template=str(raising))) as w:
        status, out = await w.post("/v1/chat/completions", body)
        assert status == 400 and out["message"] == "only user turns"
    async with serving(make_config(chat_template=str(broken))) as w:
        status, out = await w.post("/v1/chat/completions", body)
        assert status == 500 and out["type"] == "InternalServerError"
        assert out["message"].startswith("Internal server error: ")


async def test_tokenizer_without_a_template(tmp_path: Path) -> None:
    shutil.copy(DEFAULT_TOKENIZER_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    config = json.loads((DEFAULT_TOKENIZER_DIR / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    async with serving(make_config(tokenizer_path=str(tmp_path))) as w:
        body = {"messages": [{"role": "user", "content": "x"}]}
        status, out = await w.post("/v1/chat/completions", body)
        assert status == 400 and "chat template" in out["message"]
        status, _ = await w.post("/generate", {"text": "x", "sampling_params": {}})
        assert status == 200  # text prompts need no template


def test_template_sources() -> None:
    assert load_tokenizer().template.content_format == "openai"  # loops over message content
    qwen = load_tokenizer(None, str(TEMPLATE))
    assert qwen.template.content_format == "string" and qwen.template.origin == str(TEMPLATE)
    assert qwen.hf.chat_template.startswith("{#- Qwen3-Coder-style")
    assert content_format("{% for m in messages %}{{ m.content }}{% endfor %}") == "string"
    assert content_format("{% for p in message['content'] %}{% endfor %}") == "openai"
    assert content_format("{{ 'image' }}") == "openai"


def test_chat_template_file_is_read_as_sglang_reads_it(tmp_path: Path) -> None:
    file = tmp_path / "t.jinja"
    file.write_text("\n\n{{ messages[0]['content'] }}\\n{{ 'x' }}\n")
    tok = load_tokenizer(None, str(file))
    assert tok.hf.chat_template == "{{ messages[0]['content'] }}\n{{ 'x' }}"
    with pytest.raises(FileNotFoundError):
        load_tokenizer(None, str(tmp_path / "t.json"))
    (tmp_path / "t.json").write_text("{}")
    with pytest.raises(ValueError, match="Jinja"):
        load_tokenizer(None, str(tmp_path / "t.json"))
    args = parse_args(
        ["--chat-template", str(file), "--tokenizer-path", str(DEFAULT_TOKENIZER_DIR)]
    )
    assert config_from_args(args).chat_template == str(file)


@pytest.mark.parametrize("offline", ["1", None], ids=["HF_HUB_OFFLINE=1", "no-flag"])
def test_tokenizer_loads_offline(tmp_path: Path, offline: str | None) -> None:
    """No network (proxies to a closed port), with or without HF_HUB_OFFLINE: the tokenizer
    directory is all the emulator reads; a directory that does not exist fails at once instead of
    being looked up on the Hub."""
    code = (
        "from smetric_router.emulator.tokenizer import load_tokenizer\n"
        "tok = load_tokenizer()\n"
        "import sys\n"
        "print(tok.end_of_turn_id, 'torch' in sys.modules)\n"
        "try:\n    load_tokenizer('Qwen/Qwen3-Coder-30B-A3B-Instruct')\n"
        "except FileNotFoundError:\n    print('missing')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env["HF_HOME"] = str(tmp_path / "hf")
    if offline is not None:
        env["HF_HUB_OFFLINE"] = offline
    env.update(HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True)  # fmt: skip
    first, second = out.stdout.split("\n")[:2]
    assert first == f"{ReferenceTokenizer().im_end_id} False"  # no torch imported
    assert second == "missing"
