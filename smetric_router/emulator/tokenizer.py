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
import random
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from smetric_router.emulator.chat_template import ChatTemplate, resolve_template

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

DEFAULT_TOKENIZER_DIR = Path(__file__).resolve().parent.parent / "assets" / "tokenizer"
IM_END = "<|im_end|>"  # a ChatML turn's end: what the emulator's chat answers end on

# Words made of a leading space and letters are whole pre-tokenizer chunks in byte-level BPE and
# in Metaspace tokenizers alike, so a run of single-token words encodes back to the same ids.
_SAMPLE_WORD = re.compile(r" [a-z]{2,}")
_SAMPLE_ATTEMPTS = 8


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
        self._sample_words: tuple[tuple[int, str], ...] | None = None

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

    def sample_output(self, n_tokens: int, seed: int) -> tuple[str, list[int]]:
        """Text of exactly n_tokens tokens whose encode() gives back the returned ids."""
        if n_tokens < 0:
            raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
        if n_tokens == 0:
            return "", []
        words = self._words()
        for attempt in range(_SAMPLE_ATTEMPTS):
            pool = words if attempt < _SAMPLE_ATTEMPTS - 1 else words[:1]
            picks = random.Random(f"{seed}/{attempt}").choices(pool, k=n_tokens)
            ids = [token_id for token_id, _ in picks]
            text = "".join(word for _, word in picks)
            if self.encode(text) == ids:
                return text, ids
        raise RuntimeError("tokenizer cannot encode sampled words back to the same ids")

    def _words(self) -> tuple[tuple[int, str], ...]:
        if self._sample_words is None:
            backend = self._backend
            ids = list(range(backend.get_vocab_size(with_added_tokens=False)))
            texts = backend.decode_batch([[i] for i in ids], skip_special_tokens=True)
            candidates = [
                (i, t) for i, t in zip(ids, texts, strict=True) if _SAMPLE_WORD.fullmatch(t)
            ]
            encoded = backend.encode_batch([t for _, t in candidates], add_special_tokens=False)
            words = tuple(c for c, e in zip(candidates, encoded, strict=True) if e.ids == [c[0]])
            if not words:
                raise RuntimeError("tokenizer has no single-token ' word' pieces to sample from")
            self._sample_words = words
        return self._sample_words


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
