"""The bundled tokenizer and the ChatML rendering contract shared with the emulator."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from smetric_router.features.chat import DEFAULT_TOKENIZER_DIR, ChatCodec, load_codec
from smetric_router.features.errors import FeatureError


@pytest.fixture(scope="module")
def codec() -> ChatCodec:
    return load_codec()


def test_bundled_tokenizer_files() -> None:
    tokenizer = DEFAULT_TOKENIZER_DIR / "tokenizer.json"
    config = json.loads((DEFAULT_TOKENIZER_DIR / "tokenizer_config.json").read_text())
    assert tokenizer.stat().st_size < 2_000_000
    assert config["eos_token"] == "<|im_end|>"
    assert "<|im_start|>" in config["chat_template"]


def test_special_tokens_and_round_trip(codec: ChatCodec) -> None:
    assert 8000 <= codec.vocab_size <= 16384
    assert len({codec.im_start_id, codec.im_end_id}) == 2
    assert codec.eos_id == codec.im_end_id  # the bundled config names <|im_end|> as eos
    text = "def route(request):\n    return workers[hash(request) % 32]  # ünïcode ✓"
    assert codec.decode(codec.encode(text)) == text
    assert codec.encode("<|im_end|>") == [codec.im_end_id]


def test_render_is_concatenation_of_pieces(codec: ChatCodec) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are terse."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}],
        },
        {"role": "assistant", "content": None},
    ]
    want = []
    for role, content in (("system", "You are terse."), ("user", "Hi!"), ("assistant", "")):
        want += [codec.im_start_id, *codec.encode(role + "\n"), *codec.encode(content)]
        want += [codec.im_end_id, *codec.encode("\n")]
    assert codec.render_messages(messages, add_generation_prompt=False) == want
    with_prompt = codec.render_messages(messages, add_generation_prompt=True)
    assert with_prompt == [*want, codec.im_start_id, *codec.encode("assistant\n")]
    assert codec.decode(with_prompt).startswith("<|im_start|>system\nYou are terse.<|im_end|>\n")


def test_tool_calls_render_deterministically(codec: ChatCodec) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    reordered = {"function": {"arguments": "{}", "name": "ls"}, "type": "function", "id": "c1"}
    first = [{"role": "assistant", "content": None, "tool_calls": [call]}]
    second = [{"role": "assistant", "content": None, "tool_calls": [reordered]}]
    ids = codec.render_messages(first, add_generation_prompt=False)
    assert ids == codec.render_messages(second, add_generation_prompt=False)
    assert '"name":"ls"' in codec.decode(ids)
    tool = [{"role": "tool", "tool_call_id": "c1", "content": "a.txt"}]
    assert codec.decode(codec.render_messages(tool, False)) == "<|im_start|>tool\na.txt<|im_end|>\n"


@pytest.mark.parametrize(
    "message",
    [
        "not an object",
        {"content": "no role"},
        {"role": "user", "content": 3},
        {"role": "user", "content": [{"text": "no type"}]},
        {"role": "user", "content": [{"type": "text", "text": None}]},
        {"role": "assistant", "content": "", "tool_calls": {"not": "a list"}},
    ],
)
def test_malformed_messages_raise_feature_error(codec: ChatCodec, message: object) -> None:
    with pytest.raises(FeatureError, match=r"messages\[0\]"):
        codec.render_messages([message], add_generation_prompt=True)  # type: ignore[list-item]


@pytest.mark.parametrize("n_tokens", [0, 1, 17, 500])
def test_sample_output_encodes_back_exactly(codec: ChatCodec, n_tokens: int) -> None:
    text, ids = codec.sample_output(n_tokens, seed=n_tokens)
    assert len(ids) == n_tokens
    assert codec.encode(text) == ids
    assert codec.decode(ids) == text
    assert codec.im_end_id not in ids and codec.eos_id not in ids
    assert codec.sample_output(n_tokens, seed=n_tokens) == (text, ids)


def test_follow_up_prompt_contains_the_cached_output(codec: ChatCodec) -> None:
    history = [{"role": "user", "content": "list files"}]
    prompt = codec.render_messages(history, add_generation_prompt=True)
    text, ids = codec.sample_output(40, seed=7)
    cached = prompt + ids + [codec.im_end_id]
    follow_up = [
        *history,
        {"role": "assistant", "content": text},
        {"role": "user", "content": "ok"},
    ]
    assert codec.render_messages(follow_up, add_generation_prompt=True)[: len(cached)] == cached


def test_load_codec_from_dir_file_and_errors(tmp_path: Path) -> None:
    shutil.copy(DEFAULT_TOKENIZER_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    from_dir = load_codec(str(tmp_path))
    # Without tokenizer_config.json the eos falls back to <|endoftext|>.
    assert from_dir.eos_id != from_dir.im_end_id
    assert load_codec(str(tmp_path / "tokenizer.json")).im_end_id == from_dir.im_end_id
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json"):
        load_codec(str(tmp_path / "missing"))


def test_tokenizer_without_chatml_tokens_is_rejected(tmp_path: Path) -> None:
    spec = json.loads((DEFAULT_TOKENIZER_DIR / "tokenizer.json").read_text())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] != "<|im_start|>"]
    del spec["model"]["vocab"]["<|im_start|>"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="im_start"):
        load_codec(str(tmp_path))
