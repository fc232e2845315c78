"""What the emulated model answers: a reproducible synthetic text of the requested length.

The text comes from the worker's tokenizer (emulator.tokenizer), so that encode(text) gives back
exactly the emitted ids and a follow-up turn that carries the answer hits the cache in full.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from smetric_router.emulator.tokenizer import WorkerTokenizer


def answer_seed(prompt_ids: Sequence[int], n_tokens: int, rid: str | None) -> int:
    """Same prompt, length and caller rid -> same answer, across runs and processes."""
    h = hashlib.blake2b(digest_size=8)
    h.update(array("I", prompt_ids).tobytes())
    h.update(n_tokens.to_bytes(8, "little"))
    if rid is not None:
        h.update(rid.encode())
    return int.from_bytes(h.digest(), "little")


@dataclass(frozen=True, slots=True)
class Answer:
    text: str
    text_ids: list[int]  # the ids `text` encodes to
    output_ids: list[int]  # what the engine emits: text_ids, plus the end of turn (chat)
    matched_stop: int | None  # the end token, when the answer ends its turn

    @property
    def finish_type(self) -> str:
        return "length" if self.matched_stop is None else "stop"

    def first_token(self, tok: WorkerTokenizer) -> Answer:
        """What a PD prefill instance answers: the first token only."""
        ends = len(self.output_ids) == 1 and self.matched_stop is not None
        stop = self.matched_stop if ends else None
        return Answer(self.text_at(tok, 1), self.text_ids[:1], self.output_ids[:1], stop)

    def text_at(self, tok: WorkerTokenizer, n_out: int) -> str:
        """Cumulative text after n_out emitted tokens, holding back a split UTF-8 character."""
        if n_out >= len(self.text_ids):
            return self.text
        return tok.decode(self.text_ids[:n_out]).rstrip("\ufffd")


def make_answer(
    tok: WorkerTokenizer,
    prompt_ids: Sequence[int],
    max_tokens: int,
    rid: str | None,
    end_turn: bool,
) -> Answer:
    """max_tokens output tokens in all; a chat answer spends its last one on the end of turn
    (<|im_end|> for ChatML tokenizers, else EOS)."""
    n_text = max_tokens - 1 if end_turn else max_tokens
    text, ids = tok.sample_output(n_text, answer_seed(prompt_ids, max_tokens, rid))
    if end_turn:
        return Answer(text, ids, [*ids, tok.end_of_turn_id], tok.end_of_turn_id)
    return Answer(text, ids, list(ids), None)
