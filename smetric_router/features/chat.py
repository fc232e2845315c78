"""Tokenizer and ChatML chat template.

render_messages tokenizes each piece separately —
[IM_START] + enc(role + "\\n") + enc(content) + [IM_END] + enc("\\n") per message — so a prompt is
the concatenation of per-message token runs: an extractor can cache runs per message, and an
emulated worker that answers text T (caching prompt + enc(T) + [IM_END]) sees its cache hit in
full by the next turn, whose prompt contains exactly those tokens.
"""

from __future__ import annotations

import functools
import json
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
from tokenizers import Tokenizer

from smetric_router.features.errors import FeatureError

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
DEFAULT_TOKENIZER_DIR = Path(__file__).resolve().parent.parent / "assets" / "tokenizer"

# Words made of a leading space and letters are whole pre-tokenizer chunks in byte-level BPE and
# in Metaspace tokenizers alike, so a run of single-token words encodes back to the same ids.
_SAMPLE_WORD = re.compile(r" [a-z]{2,}")
_SAMPLE_ATTEMPTS = 8


def content_text(message: Mapping[str, Any], index: int = 0) -> str:
    """A message's content as rendered: text parts joined, then tool calls as JSON (sorted keys)."""
    content = message.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "".join(_part_text(part, index) for part in content)
    else:
        raise FeatureError(f"messages[{index}].content must be a string, null or a list of parts")
    tool_calls = message.get("tool_calls")
    if tool_calls is None:
        return text
    if not isinstance(tool_calls, list):
        raise FeatureError(f"messages[{index}].tool_calls must be a list")
    pieces = [text] if text else []
    for call in tool_calls:
        serialized = orjson.dumps(call, option=orjson.OPT_SORT_KEYS).decode()
        pieces.append(f"<tool_call>\n{serialized}\n</tool_call>")
    return "\n".join(pieces)


def _part_text(part: object, index: int) -> str:
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise FeatureError(f"messages[{index}].content parts must be objects with a 'type'")
    if part["type"] != "text":
        return ""  # images and other media carry no tokens the router can see
    text = part.get("text")
    if not isinstance(text, str):
        raise FeatureError(f"messages[{index}].content text parts need a string 'text'")
    return text


def message_role(message: object, index: int = 0) -> str:
    if not isinstance(message, dict):
        raise FeatureError(f"messages[{index}] must be an object")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise FeatureError(f"messages[{index}].role must be a non-empty string")
    return role


class ChatCodec:
    """A tokenizer with the special tokens of a ChatML chat template."""

    def __init__(self, tokenizer: Tokenizer, eos_token: str | None = None) -> None:
        self._tok = tokenizer
        self.im_start_id = self._special_id(IM_START)
        self.im_end_id = self._special_id(IM_END)
        eos = eos_token or (
            END_OF_TEXT if tokenizer.token_to_id(END_OF_TEXT) is not None else IM_END
        )
        self.eos_id = self._special_id(eos)
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
        self._newline = tuple(self.encode("\n"))
        self._role_ids: dict[str, tuple[int, ...]] = {}
        self.generation_prompt: tuple[int, ...] = (self.im_start_id, *self.role_ids("assistant"))
        self._sample_words: tuple[tuple[int, str], ...] | None = None

    def _special_id(self, token: str) -> int:
        token_id = self._tok.token_to_id(token)
        if token_id is None:
            raise ValueError(f"tokenizer has no {token!r} token; a ChatML tokenizer is required")
        return int(token_id)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=False))

    def role_ids(self, role: str) -> tuple[int, ...]:
        """enc(role + "\\n"), cached: roles repeat in every message."""
        ids = self._role_ids.get(role)
        if ids is None:
            ids = tuple(self.encode(role + "\n"))
            if len(self._role_ids) < 64:
                self._role_ids[role] = ids
        return ids

    def render_text(self, role: str, text: str) -> list[int]:
        """The token run of one message with the given role and rendered content."""
        return [
            self.im_start_id,
            *self.role_ids(role),
            *self.encode(text),
            self.im_end_id,
            *self._newline,
        ]

    def render_message(self, message: Mapping[str, Any], index: int = 0) -> list[int]:
        return self.render_text(message_role(message, index), content_text(message, index))

    def render_messages(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool
    ) -> list[int]:
        ids: list[int] = []
        for i, message in enumerate(messages):
            ids += self.render_message(message, i)
        if add_generation_prompt:
            ids += self.generation_prompt
        return ids

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
            ids = list(range(self._tok.get_vocab_size(with_added_tokens=False)))
            texts = self._tok.decode_batch([[i] for i in ids], skip_special_tokens=True)
            candidates = [
                (i, t) for i, t in zip(ids, texts, strict=True) if _SAMPLE_WORD.fullmatch(t)
            ]
            encoded = self._tok.encode_batch([t for _, t in candidates], add_special_tokens=False)
            words = tuple(c for c, e in zip(candidates, encoded, strict=True) if e.ids == [c[0]])
            if not words:
                raise RuntimeError("tokenizer has no single-token ' word' pieces to sample from")
            self._sample_words = words
        return self._sample_words


def load_codec(path: str | None = None) -> ChatCodec:
    """The codec of a HF tokenizer directory (tokenizer.json [+ tokenizer_config.json]) or of a
    tokenizer.json file; None loads the bundled tokenizer."""
    return _load(str(Path(path).resolve()) if path else str(DEFAULT_TOKENIZER_DIR))


@functools.lru_cache(maxsize=8)
def _load(path: str) -> ChatCodec:
    location = Path(path)
    file = location / "tokenizer.json" if location.is_dir() else location
    if not file.is_file():
        raise FileNotFoundError(f"no tokenizer.json at {location}")
    tokenizer = Tokenizer.from_file(str(file))
    config_file = file.parent / "tokenizer_config.json"
    eos: object = None
    if config_file.is_file():
        eos = json.loads(config_file.read_text(encoding="utf-8")).get("eos_token")
        if isinstance(eos, dict):
            eos = eos.get("content")
    return ChatCodec(tokenizer, eos if isinstance(eos, str) else None)
