"""A worker's chat template, chosen, read and classified as SGLang 0.5.23 does it
(sglang/srt/parser/template_manager.py, parser/jinja_template_utils.py).

- No --chat-template: the tokenizer's own template (tokenizer_config.json's `chat_template`, or a
  chat_template.jinja beside it, as transformers loads them; of several named ones, the first).
- --chat-template FILE.jinja: the file's text, newlines at either end stripped and every literal
  backslash-n turned into a newline (SGLang's _load_jinja_template).
- Its content format: "openai" when the template loops over a message's content (or names a
  media kind), so list content stays a list of parts; else "string", where the text parts of a
  list are joined with spaces before rendering.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import jinja2.nodes

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

ContentFormat = Literal["string", "openai"]
_MEDIA_WORDS = ("image", "audio", "video", "vision")
_PROBE = [{"role": "user", "content": "x"}]


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    source: str | None  # the Jinja text; None: the tokenizer has no template
    content_format: ContentFormat
    origin: str  # "tokenizer" or the --chat-template file

    def round_trip_lossy(self, hf: PreTrainedTokenizerFast, auto_adds_specials: bool) -> bool:
        """SGLang's start-up probe: does rendering to text and re-encoding differ from encoding
        straight to ids? Then chats are encoded straight to ids."""
        try:
            rendered = hf.apply_chat_template(
                _PROBE, tokenize=False, add_generation_prompt=True, return_dict=False
            )
            kwargs = {"add_special_tokens": False} if auto_adds_specials else {}
            via_text = hf.encode(rendered, **kwargs)
            via_ids = hf.apply_chat_template(
                _PROBE, tokenize=True, add_generation_prompt=True, return_dict=False
            )
            return list(via_text) != list(via_ids)
        except Exception:  # a template that needs kwargs the probe lacks tells nothing
            return False


def resolve_template(hf: PreTrainedTokenizerFast, chat_template: str | None) -> ChatTemplate:
    """The template the worker renders with, installed on hf as SGLang installs it."""
    if chat_template is not None:
        raw = read_template_file(chat_template)
        hf.chat_template = raw.replace("\\n", "\n")
        return ChatTemplate(hf.chat_template, content_format(raw), chat_template)
    template = hf.chat_template
    if isinstance(template, dict):  # named templates: SGLang takes the first
        template = next(iter(template.values()), None)
    if not isinstance(template, str):
        return ChatTemplate(None, "string", "tokenizer")
    hf.chat_template = template
    return ChatTemplate(template, content_format(template), "tokenizer")


def read_template_file(path: str) -> str:
    """A --chat-template file's text as SGLang reads it, before the backslash-n rewrite."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"chat template {path} is not a file")
    if file.suffix != ".jinja":
        raise ValueError(
            f"chat template {path}: the emulator takes Jinja templates (.jinja); SGLang's "
            "built-in and JSON conversation templates are not emulated"
        )
    return file.read_text(encoding="utf-8").strip("\n")


def content_format(template: str) -> ContentFormat:
    """SGLang's detect_jinja_template_content_format."""
    if any(word in template for word in _MEDIA_WORDS):
        return "openai"
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        ast = _compile_jinja_template(template).environment.parse(template)
    except Exception:
        return "string"
    for loop in ast.find_all(jinja2.nodes.For):
        if any(_reads(loop.iter, name, "content") for name in ("message", "msg", "m")):
            return "openai"
    return "string"


def _reads(node: jinja2.nodes.Node, name: str, key: str) -> bool:
    """node is `name[key]` or `name.key`, possibly filtered, tested or sliced."""
    if isinstance(node, jinja2.nodes.Filter | jinja2.nodes.Test):
        return node.node is not None and _reads(node.node, name, key)
    if isinstance(node, jinja2.nodes.Getitem):
        if isinstance(node.arg, jinja2.nodes.Slice):
            return _reads(node.node, name, key)
        return (
            _is_name(node.node, name)
            and isinstance(node.arg, jinja2.nodes.Const)
            and node.arg.value == key
        )
    if isinstance(node, jinja2.nodes.Getattr):
        return _is_name(node.node, name) and node.attr == key
    return False


def _is_name(node: jinja2.nodes.Node, name: str) -> bool:
    return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == name
