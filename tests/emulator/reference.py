"""Independent truths for the emulator's tokenization, made straight with transformers (not with
the emulator's code): SGLang 0.5.23 renders a chat with the tokenizer's own template,
`apply_chat_template(messages, tokenize=True, add_generation_prompt=True, tools=...)` (for
string-content messages its preprocessing changes nothing), and tokenizes a text prompt with
`tokenizer(text)`."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, cast

from transformers import PreTrainedTokenizerFast

BUNDLED = Path(__file__).resolve().parents[2] / "smetric_router" / "assets" / "tokenizer"


@functools.cache
def hf_tokenizer(path: Path = BUNDLED, chat_template: str | None = None) -> PreTrainedTokenizerFast:
    """The tokenizer of a directory, with chat_template (Jinja text) in place of its own."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    tok: PreTrainedTokenizerFast = PreTrainedTokenizerFast.from_pretrained(
        str(path), clean_up_tokenization_spaces=False, local_files_only=True
    )
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


class ReferenceTokenizer:
    def __init__(self, path: Path = BUNDLED, chat_template: str | None = None) -> None:
        self.hf = hf_tokenizer(path, chat_template)
        im_end = self.hf.convert_tokens_to_ids("<|im_end|>")  # one token: one id
        assert isinstance(im_end, int), im_end
        self.im_end_id = im_end

    def encode(self, text: str) -> list[int]:
        """Text as it appears inside a prompt (no special tokens added)."""
        return [int(i) for i in self.hf.encode(text, add_special_tokens=False)]

    def prompt_ids(self, text: str) -> list[int]:
        """A /generate or /v1/completions text prompt, as SGLang's tokenizer manager makes it."""
        return [int(i) for i in self.hf(text)["input_ids"]]

    def render_messages(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        ids = self.hf.apply_chat_template(
            messages,
            tokenize=True,
            add_generation_prompt=add_generation_prompt,
            # transformers types `tools` as an invariant list[dict | Callable]; it only reads it
            tools=tools,  # type: ignore[arg-type]
            return_dict=False,
        )
        # one conversation, tokenized, not as a dict: its ids (the annotation covers every mode)
        return [int(i) for i in cast(list[int], ids)]
