"""The emulated worker's tokenizer: a HF tokenizer directory loaded with transformers, as SGLang
0.5.23 loads it (a fast tokenizer from tokenizer.json, clean_up_tokenization_spaces=False), from
local files only: the emulator never downloads.

Text prompts (/generate `text`, /v1/completions `prompt`) are tokenized as SGLang's tokenizer
manager does it, `tokenizer(text)` with its default add_special_tokens=True. Chats go through
`emulator.chat` (the tokenizer's own chat template). Answers are synthetic: runs of single-token
" word" pieces whose encoding gives back exactly the emitted ids, so a follow-up turn that carries
an answer finds its tokens cached.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from smetric_router.emulator.chat_template import ChatTemplate, resolve_template
from smetric_router.features.sample_text import TextSampler

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

DEFAULT_TOKENIZER_DIR = Path(__file__).resolve().parent.parent / "assets" / "tokenizer"
IM_END = "<|im_end|>"  # a ChatML turn's end: what the emulator's chat answers end on


class WorkerTokenizer:
    """A loaded HF tokenizer with the chat template the worker renders with."""

    def __init__(self, hf: PreTrainedTokenizerFast, template: ChatTemplate) -> None:
        self.hf = hf
        self.template = template
        self._backend = hf.backend_tokenizer
        self.end_of_turn_id = self._end_of_turn(hf)
        # SGLang's probes, made once at start-up (serving_chat.OpenAIServingChat.__init__)
        self.auto_adds_specials = len(hf.encode("")) > 0
        self.round_trip_lossy = template.round_trip_lossy(hf, self.auto_adds_specials)
        self._sampler = TextSampler(self._backend)  # synthetic answers, not imitated from SGLang

    @staticmethod
    def _end_of_turn(hf: PreTrainedTokenizerFast) -> int:
        """<|im_end|> where the vocabulary has it (ChatML models), else the EOS token."""
        for token in (IM_END, hf.eos_token):
            if isinstance(token, str):
                token_id = hf.convert_tokens_to_ids(token)
                if isinstance(token_id, int) and token_id != hf.unk_token_id:
                    return token_id
        raise ValueError("the tokenizer has neither <|im_end|> nor an EOS token to end a turn")

    def encode_prompt(self, text: str) -> list[int]:
        """A text prompt's ids as SGLang tokenizes /generate and /v1/completions text."""
        return [int(i) for i in self.hf(text)["input_ids"]]

    def encode(self, text: str) -> list[int]:
        """Plain text, no special tokens added (answer text)."""
        return list(self._backend.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int]) -> str:
        return str(self._backend.decode(list(ids), skip_special_tokens=False))

    def sample_block(self, seed: str, n_tokens: int) -> list[tuple[int, str]]:
        """n_tokens (id, word) picks whose words joined encode() back to the ids; blocks
        joined too (emulator.answer draws an answer block by block)."""
        return self._sampler.block(seed, n_tokens)


def load_tokenizer(path: str | None = None, chat_template: str | None = None) -> WorkerTokenizer:
    """The tokenizer of a HF tokenizer (or model) directory, None: the bundled one; chat_template
    is SGLang's --chat-template (a .jinja file), None: the tokenizer's own template."""
    location = str(Path(path).resolve()) if path else str(DEFAULT_TOKENIZER_DIR)
    template = str(Path(chat_template).resolve()) if chat_template else None
    return _load(location, template)


@functools.lru_cache(maxsize=8)
def _load(path: str, chat_template: str | None) -> WorkerTokenizer:
    if not (Path(path) / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer.json in {path} (a tokenizer directory is needed)")
    # transformers advises at import that PyTorch is missing: only tokenizers are used here
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast.from_pretrained(
        path, clean_up_tokenization_spaces=False, local_files_only=True
    )
    return WorkerTokenizer(hf, resolve_template(hf, chat_template))
