"""What the emulated model answers: a reproducible synthetic text, or a tool call.

A text answer runs to its natural length (emulator.output_lengths: drawn from the request, ending
its turn) unless max_tokens cuts it first; a request with `ignore_eos` gets exactly max_tokens
tokens, as before natural lengths existed (a chat answer still spends its last on the end of
turn). A tool call (emulator.tool_calls) is the call block's ids, then the end of turn.

The text comes from the worker's tokenizer (emulator.tokenizer), so that encode(text) gives back
exactly the emitted ids and a follow-up turn that carries the answer hits the cache in full.
It is drawn lazily, a block of words at a time as the tokens are emitted and read, so an answer
costs memory for what was emitted, not for max_tokens.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterator, Sequence
from typing import overload

from smetric_router.emulator.output_lengths import natural_length
from smetric_router.emulator.tokenizer import WorkerTokenizer
from smetric_router.emulator.tool_calls import Call

BLOCK = 256  # tokens drawn at a time


def answer_seed(prompt_ids: Sequence[int], n_tokens: int, rid: str | None) -> int:
    """Same prompt, length and caller rid -> same answer, across runs and processes."""
    h = hashlib.blake2b(digest_size=8)
    h.update(array("I", prompt_ids).tobytes())
    h.update(n_tokens.to_bytes(8, "little"))
    if rid is not None:
        h.update(rid.encode())
    return int.from_bytes(h.digest(), "little")


class Answer:
    """n_text words of synthetic text (or the first n_text ids of `fixed`), then the end of turn
    when matched_stop is set; the ids the engine emits are `output_ids`, a lazy sequence over
    the same draw. `call`: the tool call the text is."""

    def __init__(
        self,
        tok: WorkerTokenizer,
        seed: int,
        n_text: int,
        end: int | None,
        fixed: Sequence[int] | None = None,
        call: Call | None = None,
    ) -> None:
        self._tok = tok
        self._seed = seed
        self.n_text = n_text
        self.matched_stop = end  # the end token, when the answer ends its turn
        self._fixed = None if fixed is None else array("I", fixed[:n_text])
        self._ids = array("I") if self._fixed is None else self._fixed  # drawn so far
        self._words: list[str] = []
        self.call = call
        self.output_ids = OutputIds(self)

    @property
    def finish_type(self) -> str:
        return "length" if self.matched_stop is None else "stop"

    def first_token(self) -> Answer:
        """What a PD prefill instance answers: the first token only (the same draw)."""
        if self.n_text:
            return Answer(self._tok, self._seed, 1, None, self._fixed)
        return Answer(self._tok, self._seed, 0, self.matched_stop)

    def drawn(self, n: int) -> array[int]:
        """The first n text ids (at most n_text), drawing what is missing."""
        n = min(n, self.n_text)
        while len(self._ids) < n:
            k = len(self._ids) // BLOCK
            picks = self._tok.sample_block(f"{self._seed}/{k}", BLOCK)
            take = picks[: min(BLOCK, self.n_text - k * BLOCK)]
            self._ids.extend(i for i, _ in take)
            self._words.extend(w for _, w in take)
        return self._ids

    def text_at(self, n_out: int) -> str:
        """Cumulative text after n_out emitted tokens."""
        return self.text_between(0, n_out)

    def text_between(self, start: int, end: int) -> str:
        """The text of emitted tokens [start, end) (the end of turn has none)."""
        end = min(end, self.n_text)
        if self._fixed is not None:  # decoded whole: a piece may hold part of a character
            before = self._tok.decode(self._fixed[:start])
            return self._tok.decode(self._fixed[:end])[len(before) :]
        self.drawn(end)
        return "".join(self._words[start:end])


class CallPieces:
    """The streamed pieces of an answer's tool call (Call.fragments) its parser has whole as the
    answer is emitted, each handed out once: (the name on the first piece, an arguments delta)."""

    def __init__(self, answer: Answer) -> None:
        self._answer = answer
        self._pieces = [] if answer.call is None else answer.call.fragments()
        self.shown = 0  # pieces handed out

    def new(self, n_out: int) -> list[tuple[str | None, str]]:
        """The pieces complete after n_out emitted tokens not handed out yet."""
        reach = len(self._answer.text_at(n_out))
        out: list[tuple[str | None, str]] = []
        while self.shown < len(self._pieces) and self._pieces[self.shown][0] <= reach:
            out.append(self._pieces[self.shown][1:])
            self.shown += 1
        return out


class OutputIds(Sequence[int]):
    """An answer's emitted ids: its text ids, then the end of turn if any; drawn when read."""

    def __init__(self, answer: Answer) -> None:
        self._a = answer

    def __len__(self) -> int:
        return self._a.n_text + (self._a.matched_stop is not None)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        a = self._a
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            out = a.drawn(min(stop, a.n_text))[start:stop].tolist()
            if stop > a.n_text and a.matched_stop is not None and start <= a.n_text:
                out.append(a.matched_stop)
            return out
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("answer id out of range")
        if index == a.n_text:
            assert a.matched_stop is not None
            return a.matched_stop
        return a.drawn(index + 1)[index]

    def __iter__(self) -> Iterator[int]:
        a = self._a
        for start in range(0, a.n_text, BLOCK):
            yield from a.drawn(min(start + BLOCK, a.n_text))[start : start + BLOCK]
        if a.matched_stop is not None:
            yield a.matched_stop


def make_answer(
    tok: WorkerTokenizer,
    prompt_ids: Sequence[int],
    max_tokens: int,
    rid: str | None,
    end_turn: bool,
    *,
    natural: bool = True,
    call: Call | None = None,
) -> Answer:
    """At most max_tokens output tokens. natural: the answer ends its turn at its natural length
    (or is the call, when it fits), else max_tokens cut it; not natural (ignore_eos): exactly
    max_tokens, a chat answer (end_turn) spending its last on the end of turn (<|im_end|> for
    ChatML tokenizers, else EOS)."""
    end = tok.end_of_turn_id
    if not natural:
        seed = answer_seed(prompt_ids, max_tokens, rid)
        if end_turn:
            return Answer(tok, seed, max_tokens - 1, end)
        return Answer(tok, seed, max_tokens, None)
    seed = answer_seed(prompt_ids, 0, rid)  # not the budget: a longer one only uncuts the text
    if call is not None:
        ids = tok.encode(call.text)
        if len(ids) < max_tokens:
            return Answer(tok, seed, len(ids), end, ids, call)
    n = natural_length(seed)
    if n <= max_tokens:
        return Answer(tok, seed, n - 1, end)
    return Answer(tok, seed, max_tokens, None)
