"""The model's tokenizer and chat template, applied to chat requests as SGLang 0.5.23 applies
them (model_files: which template; sglang_chat: what the template is given; jinja_env: how it
renders; prompt_tokenizer: how the text is tokenized).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

import jinja2

from smetric_router.features.errors import FeatureError
from smetric_router.features.jinja_env import compile_reusing, compile_template
from smetric_router.features.loop_reuse import Loops, Text
from smetric_router.features.model_files import (
    DEFAULT_TOKENIZER_DIR,
    locate,
    model_chat_template,
    special_tokens,
    template_file,
)
from smetric_router.features.prompt_tokenizer import PromptTokenizer, load_tokenizer
from smetric_router.features.rendered import common_prefix
from smetric_router.features.sglang_chat import Message, template_message
from smetric_router.features.template_traits import TemplateTraits, template_traits

log = logging.getLogger(__name__)


class ChatTokenizer:
    """Renders and tokenizes chat requests exactly as an SGLang worker serving the model does."""

    def __init__(
        self, tokenizer: PromptTokenizer, template: str, special: dict[str, str], origin: str
    ) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.origin = origin  # where the template came from, for logs
        try:
            self._compiled = compile_template(template)
        except jinja2.TemplateError as e:
            raise ValueError(f"chat template from {origin}: {e}") from e
        self.traits: TemplateTraits = template_traits(template)
        self._special = special
        self._reusing = compile_reusing(template)

    def message(self, message: object, index: int) -> Message:
        return template_message(message, index, self.traits.content_format)

    def render(
        self,
        messages: Sequence[Message],
        tools: list[dict[str, Any]] | None,
        kwargs: dict[str, Any],
        add_generation_prompt: bool,
    ) -> str:
        """The prompt text, as apply_chat_template(tokenize=False) renders it in SGLang (which
        retries a failed render with the tools' bare function objects)."""
        if not messages:
            raise FeatureError("Cannot apply chat template to an empty conversation.")
        try:
            return self._render(messages, tools, kwargs, add_generation_prompt)
        except Exception:
            flat = [t.get("function", t) for t in tools] if tools else None
            try:
                return self._render(messages, flat, kwargs, add_generation_prompt)
            except Exception as e:
                raise FeatureError(f"Chat template error: {e}") from e

    def render_reusing(
        self,
        messages: Sequence[Message],
        tools: list[dict[str, Any]] | None,
        kwargs: dict[str, Any],
        add_generation_prompt: bool,
        base: Loops | None,
        source: Text | None,
    ) -> tuple[str, Loops | None]:
        """render's text, reusing the loop iterations of an earlier render (base, whose text
        source gives) where they are known to render the same (loop_reuse); also this render's
        loops for a later one."""
        if self._reusing is None or not messages:
            return self.render(messages, tools, kwargs, add_generation_prompt), None
        variables = self._variables(messages, tools, kwargs, add_generation_prompt)
        try:
            return self._reusing.render(variables, base, source)
        except Exception:  # rendered again as written, for render's retry and error
            return self.render(messages, tools, kwargs, add_generation_prompt), None

    def shared_prefix(
        self,
        messages: Sequence[Message],
        tools: list[dict[str, Any]] | None,
        kwargs: dict[str, Any],
        add_generation_prompt: bool,
        base: Loops | None,
        text: str,
    ) -> int:
        """The length of the common prefix of render's text and text; base: the loops of the
        render that made text, whose reused runs are not compared again (render_reusing)."""
        if self._reusing is None or not messages:
            return common_prefix(self.render(messages, tools, kwargs, add_generation_prompt), text)
        variables = self._variables(messages, tools, kwargs, add_generation_prompt)
        try:
            return self._reusing.shared_prefix(variables, base, text)
        except Exception:
            shown = self.render(messages, tools, kwargs, add_generation_prompt)
            return common_prefix(shown, text)

    def _variables(
        self,
        messages: Sequence[Message],
        tools: list[dict[str, Any]] | None,
        kwargs: dict[str, Any],
        add_generation_prompt: bool,
    ) -> dict[str, Any]:
        # as _render passes them (a kwarg named like one of these is a TypeError there too)
        return dict(
            messages=messages,
            tools=tools,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **{**self._special, **kwargs},
        )

    def _render(
        self,
        messages: Sequence[Message],
        tools: list[dict[str, Any]] | None,
        kwargs: dict[str, Any],
        add_generation_prompt: bool,
    ) -> str:
        variables = {**self._special, **kwargs}
        return self._compiled.render(
            messages=messages,
            tools=tools,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **variables,
        )


def load_chat_tokenizer(path: str | None = None, chat_template: str | None = None) -> ChatTokenizer:
    """The tokenizer at `path` (a HF tokenizer directory or tokenizer.json file; None: the bundled
    one) with `chat_template` (a .jinja file, as SGLang's --chat-template) or else the model
    directory's own template (the bundled ChatML template where it has none)."""
    resolved = str(locate(path).tokenizer_file)
    return _load(resolved, chat_template and str(chat_template))


@functools.lru_cache(maxsize=8)
def _load(tokenizer_file: str, chat_template: str | None) -> ChatTokenizer:
    files = locate(tokenizer_file)
    special = special_tokens(files)
    tokenizer = load_tokenizer(files, special.get("bos_token"))
    if chat_template:
        return ChatTokenizer(tokenizer, template_file(chat_template), special, chat_template)
    template = model_chat_template(files)
    if template is not None:
        return ChatTokenizer(tokenizer, template, special, str(files.directory))
    fallback = _bundled_template()
    log.warning(
        "%s has no chat template: chats are rendered with the bundled ChatML template "
        "(give the workers' template with --chat-template)",
        files.directory,
    )
    return ChatTokenizer(tokenizer, fallback, special, "bundled ChatML")


def _bundled_template() -> str:
    template = model_chat_template(locate(str(DEFAULT_TOKENIZER_DIR)))
    if template is None:
        raise RuntimeError("the bundled tokenizer has lost its chat template")
    return template
