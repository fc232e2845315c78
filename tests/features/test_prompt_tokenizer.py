"""Where a rendered prompt may be cut so that its tail can be tokenized alone."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
from tokenizers.pre_tokenizers import PreTokenizer

from smetric_router.features.model_files import locate
from smetric_router.features.prompt_tokenizer import PromptTokenizer, load_tokenizer

TOKENIZER = load_tokenizer(locate(None))
PIECES = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "\n", " ", "  ", "\n\n", "user",
          " x", "é", "🙂", "def f():\n    return 1\n", "<|im", "_end|>"]  # fmt: skip
texts = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=6)), max_size=30).map("".join)


@settings(max_examples=300, deadline=None, database=None)
@given(texts)
def test_ids_split_at_every_cut_point(text: str) -> None:
    whole = TOKENIZER.encode_chat(text)
    cuts = TOKENIZER.cut_points(text, 0, whole, 0)
    assert cuts is not None
    ends, before = cuts
    for end, count in zip(ends, before, strict=True):
        assert whole[:count] == TOKENIZER.encode_chat(text[:end])
        assert whole[count:] == TOKENIZER.encode_chat(text[end:])


def test_cut_points_count_ids_from_where_the_tail_starts() -> None:
    text = "a<|im_end|>b<|im_start|>"
    tail = TOKENIZER.encode_chat(text[1:])
    cuts = TOKENIZER.cut_points(text, 1, tail, 5)
    assert cuts is not None
    assert list(cuts[0]) == [11, 24] and list(cuts[1]) == [6, 8]


def bare(pre: PreTokenizer, tokens: list[AddedToken]) -> PromptTokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre
    tokenizer.add_special_tokens(tokens)
    return PromptTokenizer(tokenizer)


def test_tokenizers_that_look_across_a_cut_are_tokenized_whole() -> None:
    plain = [AddedToken("<s>", special=True, normalized=False)]
    assert bare(pre_tokenizers.ByteLevel(add_prefix_space=False), plain).cuts is not None
    assert bare(pre_tokenizers.Metaspace(), plain).cuts is None  # the first piece differs
    stripping = [AddedToken("<s>", special=True, normalized=False, lstrip=True)]
    assert bare(pre_tokenizers.ByteLevel(), stripping).cuts is None
    nested = [AddedToken(t, special=True, normalized=False) for t in ("<s>", "<s><s>x")]
    assert bare(pre_tokenizers.ByteLevel(), nested).cuts is None


def test_tokens_configured_but_missing_are_added(tmp_path: Path) -> None:
    path = tmp_path
    files = locate(None)
    (path / "tokenizer.json").write_bytes(files.tokenizer_file.read_bytes())
    decoder = {"9000": {"content": "<tool_call>", "special": False, "normalized": False}}
    (path / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": decoder}))
    tokenizer = load_tokenizer(locate(str(path)))
    (token,) = tokenizer.encode_chat("<tool_call>")
    assert tokenizer.backend.id_to_token(token) == "<tool_call>"
    assert tokenizer.cuts is not None and tokenizer.cuts.search("x<tool_call>") is not None
