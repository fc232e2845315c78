"""A prompt's tokenizing held to a budget: a prompt that reaches the context is refused after a
prefix of it, never by overcounting; long texts are tokenized without holding the GIL; and work
too big for the event loop is handed back (Offload) before anything is kept."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from smetric_router.features.budget import Budget, Offload, PromptTooLong
from smetric_router.features.chat_tokenizer import load_chat_tokenizer
from smetric_router.features.extract import FeatureExtractor
from smetric_router.features.model_files import locate
from smetric_router.features.prompt_tokenizer import (
    PROBE_MIN_CHARS,
    load_tokenizer,
)
from smetric_router.features.sample_text import TextSampler

TOKENIZER = load_tokenizer(locate(None))
WORDS = [w for _, w in TextSampler(TOKENIZER.backend).words()[:3000]]


def words(chars: int, seed: int) -> str:
    rnd = random.Random(seed)
    out: list[str] = []
    n = 0
    while n < chars:
        out.append(rnd.choice(WORDS))
        n += len(out[-1])
    return "".join(out)[:chars]


def kinds(chars: int) -> dict[str, str]:
    """Texts whose tokens straddle the probe's cuts in different ways."""
    rnd = random.Random(3)
    return {
        "words": words(chars, 1),
        "one long run": "ab" * (chars // 2),
        "unicode": "".join(rnd.choice("日本語テキスト🙂é \n") for _ in range(chars)),
        "code": ("def f(x):\n    return x  # <|im_end|>\n\n" * (chars // 36 + 1))[:chars],
        "spaces": ("   \n\t  " + "x" * 37) * (chars // 44),
    }


@pytest.mark.parametrize("kind", list(kinds(10)))
def test_the_prefix_count_never_overcounts(kind: str) -> None:
    text = kinds(200_000)[kind]
    true = len(TOKENIZER.encode_chat(text))
    # claiming `true + 1` tokens would be an overcount: it must not
    assert TOKENIZER.count_reaching(text, true + 1) is None
    # a limit a little below is found, with a count that is still a lower bound
    found = TOKENIZER.count_reaching(text, int(true * 0.9))
    assert found is not None and int(true * 0.9) <= found <= true


class Recording:
    """The backend tokenizer, recording how many characters it was given."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.chars = 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.backend, name)

        def call(inputs: Any, *args: Any, **kwargs: Any) -> Any:
            self.chars += len(inputs) if isinstance(inputs, str) else sum(map(len, inputs))
            return method(inputs, *args, **kwargs)

        return call


def test_a_huge_prompt_is_refused_after_a_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    tok = load_tokenizer(locate(None))
    spy = Recording(tok.backend)
    monkeypatch.setattr(tok, "_tok", spy)  # a stand-in for the tokenizers.Tokenizer it wraps
    text = words(4_000_000, 7)
    with pytest.raises(PromptTooLong) as refused:
        tok.encode_text(text, Budget(context_length=20_000))
    assert refused.value.at_least and refused.value.tokens >= 20_000
    assert str(refused.value).startswith("The input (at least ")
    assert spy.chars < len(text) // 4, f"tokenized {spy.chars} of {len(text)} characters"
    # below the probe's threshold the count is exact
    short = words(PROBE_MIN_CHARS // 2, 8)
    n = len(tok.encode_text(short))
    with pytest.raises(PromptTooLong) as exact:
        tok.encode_text(short, Budget(context_length=n))
    assert not exact.value.at_least and exact.value.tokens == n
    assert len(tok.encode_text(short, Budget(context_length=n + 1))) == n


def test_long_texts_are_tokenized_the_same_without_holding_the_gil() -> None:
    text = words(1_500_000, 9)
    whole = TOKENIZER.backend.encode(text, add_special_tokens=False)
    assert TOKENIZER.encode_chat(text) == list(whole.ids)
    done = threading.Event()

    def tokenize() -> None:
        TOKENIZER.encode_text(text)
        done.set()

    worker = threading.Thread(target=tokenize)
    worker.start()
    gaps, last = [], time.monotonic()
    while not done.is_set():
        time.sleep(0.002)
        now = time.monotonic()
        gaps.append(now - last)
        last = now
    worker.join()
    assert len(gaps) > 10 and max(gaps) < 0.25, f"{len(gaps)} turns, longest {max(gaps):.2f} s"


def test_offload_is_raised_before_anything_is_kept() -> None:
    chat = load_chat_tokenizer()
    body = {"messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": words(50_000, 11)}]}  # fmt: skip
    extractor = FeatureExtractor(chat, page_size=16)
    with pytest.raises(Offload):
        extractor.from_chat(body, Budget(inline_chars=8192))
    with pytest.raises(Offload):
        extractor.from_generate({"text": words(10_000, 12)}, budget=Budget(inline_chars=8192))
    small = extractor.from_chat({"messages": [{"role": "user", "content": "hi"}]},
                                Budget(inline_chars=8192))  # fmt: skip
    assert small.prompt_len > 0
    off_loop = extractor.from_chat(body, Budget(context_length=1 << 20))
    fresh = FeatureExtractor(chat, page_size=16).from_chat(body)
    assert off_loop.page_hashes == fresh.page_hashes and off_loop.prompt_len == fresh.prompt_len
    with pytest.raises(PromptTooLong):
        FeatureExtractor(chat, page_size=16).from_chat(body, Budget(context_length=1000))
