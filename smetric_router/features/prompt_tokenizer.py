"""A model's tokenizer as SGLang 0.5.23 uses it through transformers 5.19, and where a rendered
prompt may be cut so that its tail can be tokenized alone.

The backend is tokenizer.json, completed as transformers completes it on load: added tokens
listed in tokenizer_config.json but missing from tokenizer.json are added, and truncation and
padding are off. Chat prompts are tokenized with add_special_tokens=False (apply_chat_template);
text prompts of /generate and /v1/completions with the post-processor's special tokens, as
SGLang's tokenizer manager calls the tokenizer.

Cut points. A fast tokenizer first splits the text at added-token matches (leftmost-longest, on
the raw text for tokens with normalized=False) and then normalizes, pre-tokenizes and encodes
each piece alone, so the ids of `text` are the ids of text[:e] followed by those of text[e:]
wherever e is the end of such a match. When the tail after e changes, the match still ends at e
unless an added token contains another one; Metaspace-style pre-tokenizers treat the first piece
of an input differently, and lstrip / rstrip / single_word tokens look across the cut. Tokenizers
with any of these are tokenized whole (`cuts` is None), which is exact but not incremental.
"""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

from tokenizers import AddedToken, Tokenizer

from smetric_router.features.budget import UNLIMITED, Budget, Offload, PromptTooLong
from smetric_router.features.model_files import ModelFiles

# Texts longer than this go through encode_batch, which releases the GIL while it runs (encode
# holds it), so a thread tokenizing a huge prompt leaves the event loop free.
GIL_FREE_CHARS = 1 << 12
# A text longer than this whose tokens may reach the context is first counted by pieces.
PROBE_MIN_CHARS = 1 << 18
PROBE_PIECE = 1 << 16  # characters per counted piece
# Tokens within this many characters of a piece's cut are not counted: a cut changes the
# tokens only near it (pre-tokenizer pieces and BPE merges are local), so the tokens counted
# are tokens of the whole text, and the count a lower bound of its length.
PROBE_EDGE = 1 << 10
_PROBE_BATCH = 16  # pieces per encode_batch call, at most

# Pre-tokenizers that act on each piece alone, whatever its position in the input.
_POSITION_FREE_PRE_TOKENIZERS = frozenset(
    {
        "ByteLevel",
        "Split",
        "Digits",
        "Punctuation",
        "Whitespace",
        "WhitespaceSplit",
        "BertPreTokenizer",
        "CharDelimiterSplit",
        "UnicodeScripts",
    }
)


class PromptTokenizer:
    def __init__(self, tokenizer: Tokenizer, bos_token: str | None = None) -> None:
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._tok = tokenizer
        added = list(tokenizer.get_added_tokens_decoder().items())
        raw = [(i, t.content) for i, t in added if not t.normalized and t.content]
        self.cuts: re.Pattern[str] | None = None
        self.cut_ids: frozenset[int] = frozenset(i for i, _ in raw)
        if raw and _splits_alone(tokenizer, [t for _, t in added]):
            # longest first: Python's leftmost-first alternation is then leftmost-longest
            texts = sorted({c for _, c in raw}, key=len, reverse=True)
            self.cuts = re.compile("|".join(re.escape(c) for c in texts))
        bos_id = tokenizer.token_to_id(bos_token) if bos_token else None
        self.bos_id: int | None = None if bos_id is None else int(bos_id)

    @property
    def backend(self) -> Tokenizer:
        return self._tok

    def encode_chat(self, text: str, budget: Budget = UNLIMITED, before: int = 0) -> list[int]:
        """A rendered chat prompt's ids, as apply_chat_template(tokenize=True) gives them;
        before: ids of the prompt ahead of text (counted against the budget's context)."""
        return self._encode(text, False, budget, before)

    def encode_text(self, text: str, budget: Budget = UNLIMITED, before: int = 0) -> list[int]:
        """A raw text prompt's ids, as SGLang tokenizes /generate and /v1/completions text."""
        return self._encode(text, True, budget, before)

    def _encode(self, text: str, special: bool, budget: Budget, before: int) -> list[int]:
        if budget.inline_chars is not None and len(text) > budget.inline_chars:
            raise Offload
        context = budget.context_length
        if context is not None and len(text) > PROBE_MIN_CHARS:
            counted = self.count_reaching(text, context - before)
            if counted is not None:
                raise PromptTooLong(before + counted, context, at_least=True)
        if len(text) > GIL_FREE_CHARS:
            ids = list(self._tok.encode_batch_fast([text], add_special_tokens=special)[0].ids)
        else:
            ids = list(self._tok.encode(text, add_special_tokens=special).ids)
        if context is not None and before + len(ids) >= context:
            raise PromptTooLong(before + len(ids), context, at_least=False)
        return ids

    def count_reaching(self, text: str, limit: int) -> int | None:
        """A lower bound of text's token count that reaches limit, found by tokenizing it piece
        by piece (a few pieces first, then more at a time); None once it is clear that the text
        stays below (the rate so far puts it under half the limit) or the text ends."""
        counted = done = 0
        batch = 1
        while done < len(text):
            starts = range(done, min(len(text), done + batch * PROBE_PIECE), PROBE_PIECE)
            pieces = [text[s : s + PROBE_PIECE] for s in starts]
            encodings = self._tok.encode_batch(pieces, add_special_tokens=False)
            for start, piece, enc in zip(starts, pieces, encodings, strict=True):
                lo = 0 if start == 0 else PROBE_EDGE
                hi = len(piece) if start + len(piece) == len(text) else len(piece) - PROBE_EDGE
                counted += sum(1 for a, b in enc.offsets if a >= lo and b <= hi)
                done = start + len(piece)
            if counted >= limit:
                return counted
            if 2 * counted * len(text) < limit * done:
                return None
            batch = min(2 * batch, _PROBE_BATCH)
        return None

    def decode(self, ids: Iterable[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=False))

    def cut_points(
        self, text: str, start: int, ids: Sequence[int], first_token: int
    ) -> tuple[array[int], array[int]] | None:
        """The cut points in text[start:] whose ids are `ids`: (end characters, ids before each
        end, counted from first_token); None when they cannot be told apart exactly."""
        if self.cuts is None:
            return None
        ends = array("q", (m.end() for m in self.cuts.finditer(text, start)))
        cut_ids = self.cut_ids
        after = array("q", (first_token + i + 1 for i, t in enumerate(ids) if t in cut_ids))
        return (ends, after) if len(ends) == len(after) else None


def _splits_alone(tokenizer: Tokenizer, added: list[AddedToken]) -> bool:
    if any(t.lstrip or t.rstrip or t.single_word for t in added):
        return False
    if _nested([t.content for t in added if t.content]):
        return False
    config = json.loads(tokenizer.to_str())
    return _position_free(config.get("pre_tokenizer"))


def _nested(contents: list[str]) -> bool:
    """Whether some added token occurs inside another one."""
    known = set(contents)
    lengths = sorted({len(c) for c in known})
    for text in known:
        for size in lengths:
            if size >= len(text):
                break
            if any(text[i : i + size] in known for i in range(len(text) - size + 1)):
                return True
    return False


def _position_free(config: Any) -> bool:
    if config is None:
        return True
    if config.get("type") == "Sequence":
        return all(_position_free(c) for c in config.get("pretokenizers", []))
    return config.get("type") in _POSITION_FREE_PRE_TOKENIZERS


def load_tokenizer(files: ModelFiles, bos_token: str | None = None) -> PromptTokenizer:
    tokenizer = Tokenizer.from_file(str(files.tokenizer_file))
    _add_configured_tokens(tokenizer, files.config)
    return PromptTokenizer(tokenizer, bos_token)


def _add_configured_tokens(tokenizer: Tokenizer, config: dict[str, Any]) -> None:
    """transformers adds tokenizer_config.json's added tokens that tokenizer.json lacks."""
    decoder = config.get("added_tokens_decoder")
    if not isinstance(decoder, dict):
        return
    known = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
    for _, spec in sorted(decoder.items(), key=lambda kv: int(kv[0])):
        if not isinstance(spec, dict) or spec.get("content") in known:
            continue
        token = AddedToken(
            spec["content"],
            single_word=bool(spec.get("single_word", False)),
            lstrip=bool(spec.get("lstrip", False)),
            rstrip=bool(spec.get("rstrip", False)),
            normalized=bool(spec.get("normalized", not spec.get("special", False))),
            special=bool(spec.get("special", False)),
        )
        if token.special:
            tokenizer.add_special_tokens([token])
        else:
            tokenizer.add_tokens([token])
