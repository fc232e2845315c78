"""A model's tokenizer files as transformers 5.19 reads them for SGLang 0.5.23: where the
tokenizer is, which chat template applies, and the named special tokens a template sees.

Chat template, in SGLang's order: `--chat-template PATH` (a .jinja file, read as SGLang reads it:
surrounding newlines stripped and literal "\\n" made newlines) over the model directory's own,
where transformers takes chat_template.jinja and additional_chat_templates/*.jinja over the
"chat_template" entry of tokenizer_config.json; when that gives several named templates, SGLang
uses the first. SGLang's built-in conversation templates (names, .json files) are not supported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_TOKENIZER_DIR = Path(__file__).resolve().parent.parent / "assets" / "tokenizer"
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
LEGACY_SPECIALS_FILE = "special_tokens_map.json"
TEMPLATE_FILE = "chat_template.jinja"
TEMPLATE_DIR = "additional_chat_templates"
# transformers' named special tokens (PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES)
NAMED_SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


@dataclass(frozen=True, slots=True)
class ModelFiles:
    directory: Path
    tokenizer_file: Path
    config: dict[str, Any] = field(default_factory=dict)


def locate(path: str | None) -> ModelFiles:
    """A HF tokenizer directory (tokenizer.json [+ tokenizer_config.json]) or a tokenizer.json
    file; None: the tokenizer bundled with smetric-router."""
    location = Path(path).resolve() if path else DEFAULT_TOKENIZER_DIR
    file = location / TOKENIZER_FILE if location.is_dir() else location
    if not file.is_file():
        raise FileNotFoundError(f"no {TOKENIZER_FILE} at {location}")
    config_file = file.parent / CONFIG_FILE
    config = _read_json(config_file) if config_file.is_file() else {}
    return ModelFiles(file.parent, file, config)


def _read_json(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    return data


def model_chat_template(files: ModelFiles) -> str | None:
    """The template SGLang takes from the model directory, or None where it has none."""
    templates: dict[str, str] = {}
    default = files.directory / TEMPLATE_FILE
    if default.is_file():
        templates["default"] = default.read_text(encoding="utf-8")
    extra = files.directory / TEMPLATE_DIR
    if extra.is_dir():
        for file in extra.glob("*.jinja"):
            templates[file.name.removesuffix(".jinja")] = file.read_text(encoding="utf-8")
    if not templates:
        entry = files.config.get("chat_template")
        if isinstance(entry, str):
            return entry
        if isinstance(entry, list):
            templates = {t["name"]: t["template"] for t in entry if isinstance(t, dict)}
    return next(iter(templates.values()), None)


def template_file(path: str) -> str:
    """A `--chat-template` file, as SGLang's TemplateManager loads a Jinja one."""
    if not path.endswith(".jinja"):
        raise ValueError(
            f"--chat-template {path}: only Jinja templates (.jinja files) are supported, "
            "not SGLang's built-in or JSON conversation templates"
        )
    text = Path(path).read_text(encoding="utf-8")
    return text.strip("\n").replace("\\n", "\n")


def special_tokens(files: ModelFiles) -> dict[str, str]:
    """transformers' special_tokens_map: the named special tokens that are set, as strings
    (templates receive them as variables, e.g. bos_token)."""
    values: dict[str, Any] = {k: files.config.get(k) for k in NAMED_SPECIAL_TOKENS}
    legacy = files.directory / LEGACY_SPECIALS_FILE
    if "added_tokens_decoder" not in files.config and legacy.is_file():
        # transformers reads special_tokens_map.json only for configs without the decoder entry
        values.update({k: v for k, v in _read_json(legacy).items() if k in values})
    out: dict[str, str] = {}
    for name, value in values.items():
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[name] = value
    return out
