"""Which tokenizer and chat template the router takes from a model directory, as transformers
5.19 and SGLang 0.5.23 take them."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest

from smetric_router.features.chat_tokenizer import load_chat_tokenizer
from smetric_router.features.model_files import (
    DEFAULT_TOKENIZER_DIR,
    locate,
    model_chat_template,
    special_tokens,
    template_file,
)


def model_dir(tmp_path: Path, config: Mapping[str, object] | None = None) -> Path:
    shutil.copy(DEFAULT_TOKENIZER_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    if config is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


def test_bundled_tokenizer_files() -> None:
    files = locate(None)
    assert files.tokenizer_file.stat().st_size < 2_000_000
    assert special_tokens(files) == {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    assert "<|im_start|>" in (model_chat_template(files) or "")


def test_locate_a_directory_or_a_file(tmp_path: Path) -> None:
    path = model_dir(tmp_path, {"chat_template": "T"})
    assert locate(str(path)).tokenizer_file == path / "tokenizer.json"
    assert locate(str(path / "tokenizer.json")).config == {"chat_template": "T"}
    with pytest.raises(FileNotFoundError):
        locate(str(tmp_path / "missing"))


def test_template_files_take_precedence_over_the_config(tmp_path: Path) -> None:
    path = model_dir(tmp_path, {"chat_template": "from config"})
    assert model_chat_template(locate(str(path))) == "from config"
    (path / "chat_template.jinja").write_text("from file")
    assert model_chat_template(locate(str(path))) == "from file"
    # several named templates: SGLang takes the first (transformers' "default" first)
    (path / "additional_chat_templates").mkdir()
    (path / "additional_chat_templates" / "tool_use.jinja").write_text("tools")
    assert model_chat_template(locate(str(path))) == "from file"


def test_named_templates_in_the_config(tmp_path: Path) -> None:
    named = [{"name": "default", "template": "A"}, {"name": "tool_use", "template": "B"}]
    assert model_chat_template(locate(str(model_dir(tmp_path, {"chat_template": named})))) == "A"


def test_no_template(tmp_path: Path) -> None:
    path = model_dir(tmp_path)
    assert model_chat_template(locate(str(path))) is None
    # the router falls back to the bundled ChatML template (and logs it)
    chat = load_chat_tokenizer(str(path))
    assert chat.origin == "bundled ChatML" and "<|im_start|>" in chat.template


def test_chat_template_file_is_read_as_sglang_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "t.jinja"
    path.write_text("\n\n{{ 'a\\\\n' }}x\\ny\n")
    # surrounding newlines stripped, every literal backslash-n made a newline
    assert template_file(str(path)) == "{{ 'a\\\n' }}x\ny"
    with pytest.raises(ValueError, match="only Jinja templates"):
        template_file(str(tmp_path / "conv.json"))


def test_chat_template_option_overrides_the_model(tmp_path: Path) -> None:
    path = model_dir(tmp_path, {"chat_template": "model"})
    override = tmp_path / "mine.jinja"
    override.write_text("{% for m in messages %}[{{ m.content }}]{% endfor %}")
    chat = load_chat_tokenizer(str(path), str(override))
    assert chat.render([{"role": "user", "content": "hi"}], None, {}, True) == "[hi]"
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for %}")
    with pytest.raises(ValueError, match=r"bad\.jinja"):
        load_chat_tokenizer(str(path), str(bad))


def test_special_tokens(tmp_path: Path) -> None:
    config = {
        "bos_token": {"content": "<s>", "special": True},
        "eos_token": "</s>",
        "unk_token": None,
        "added_tokens_decoder": {},
    }
    assert special_tokens(locate(str(model_dir(tmp_path, config)))) == {
        "bos_token": "<s>",
        "eos_token": "</s>",
    }
    # special_tokens_map.json is read only by configs without added_tokens_decoder (legacy)
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<e>"}))
    assert special_tokens(locate(str(tmp_path)))["eos_token"] == "</s>"
    del config["added_tokens_decoder"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert special_tokens(locate(str(tmp_path)))["eos_token"] == "<e>"


def test_templates_see_the_special_tokens(tmp_path: Path) -> None:
    config = {"chat_template": "{{ bos_token }}|{{ eos_token }}", "bos_token": "<|endoftext|>"}
    path = model_dir(tmp_path, config | {"eos_token": "<|im_end|>"})
    chat = load_chat_tokenizer(str(path))
    assert chat.render([{"role": "user", "content": ""}], None, {}, False) == (
        "<|endoftext|>|<|im_end|>"
    )
    assert chat.tokenizer.bos_id == chat.tokenizer.backend.token_to_id("<|endoftext|>")
