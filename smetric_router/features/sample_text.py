"""Text of an exact number of tokens, for load generators, benchmarks and tests.

Words made of a leading space and letters are whole pre-tokenizer chunks in byte-level BPE and in
Metaspace tokenizers alike, so a run of single-token words encodes back to the same ids.
"""

from __future__ import annotations

import random
import re

from tokenizers import Tokenizer

_SAMPLE_WORD = re.compile(r" [a-z]{2,}")
_ATTEMPTS = 8


class TextSampler:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._words: tuple[tuple[int, str], ...] | None = None

    def sample(self, n_tokens: int, seed: int) -> tuple[str, list[int]]:
        """Text of exactly n_tokens tokens whose encoding (no special tokens) is the returned
        ids."""
        if n_tokens < 0:
            raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
        if n_tokens == 0:
            return "", []
        words = self.words()
        for attempt in range(_ATTEMPTS):
            pool = words if attempt < _ATTEMPTS - 1 else words[:1]
            picks = random.Random(f"{seed}/{attempt}").choices(pool, k=n_tokens)
            ids = [token_id for token_id, _ in picks]
            text = "".join(word for _, word in picks)
            if self._tok.encode(text, add_special_tokens=False).ids == ids:
                return text, ids
        raise RuntimeError("tokenizer cannot encode sampled words back to the same ids")

    def block(self, seed: str, n_tokens: int) -> list[tuple[int, str]]:
        """n_tokens (id, word) picks whose joined words encode to their ids: a block of a text
        drawn piece by piece (words that start with a space begin a pre-tokenizer piece, so
        blocks joined encode to their ids joined)."""
        words = self.words()
        for attempt in range(_ATTEMPTS):
            pool = words if attempt < _ATTEMPTS - 1 else words[:1]
            picks = random.Random(f"{seed}/{attempt}").choices(pool, k=n_tokens)
            text = "".join(word for _, word in picks)
            if self._tok.encode(text, add_special_tokens=False).ids == [i for i, _ in picks]:
                return picks
        raise RuntimeError("tokenizer cannot encode sampled words back to the same ids")

    def words(self) -> tuple[tuple[int, str], ...]:
        """(id, text) of the vocabulary's single-token ' word' pieces."""
        if self._words is None:
            ids = list(range(self._tok.get_vocab_size(with_added_tokens=False)))
            texts = self._tok.decode_batch([[i] for i in ids], skip_special_tokens=True)
            candidates = [
                (i, t) for i, t in zip(ids, texts, strict=True) if _SAMPLE_WORD.fullmatch(t)
            ]
            encoded = self._tok.encode_batch([t for _, t in candidates], add_special_tokens=False)
            words = tuple(c for c, e in zip(candidates, encoded, strict=True) if e.ids == [c[0]])
            if not words:
                raise RuntimeError("tokenizer has no single-token ' word' pieces to sample from")
            self._words = words
        return self._words
