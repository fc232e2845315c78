"""What one request's tokenizing may cost where it runs, and how long its prompt may be.

A prompt is refused once it is known to reach the served context (SGLang refuses
`input >= context_len`), before all of a huge text is tokenized: prompt_tokenizer counts the
tokens of a prefix first. Work above `inline_chars` characters is not done on the event loop:
the extraction raises Offload and the caller runs it again in a thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from smetric_router.features.errors import FeatureError


@dataclass(frozen=True, slots=True)
class Budget:
    context_length: int | None = None  # prompts of this many tokens or more are refused
    inline_chars: int | None = None  # tokenizing more characters than this raises Offload


UNLIMITED = Budget()


class Offload(Exception):
    """Too much to tokenize on the event loop: run the extraction again in a thread."""


class PromptTooLong(FeatureError):
    """The prompt reaches the context length; `tokens` is exact, or a lower bound (`at_least`)
    when only a prefix was tokenized."""

    def __init__(self, tokens: int, context_length: int, at_least: bool) -> None:
        self.tokens = tokens
        self.context_length = context_length
        self.at_least = at_least
        count = f"at least {tokens}" if at_least else str(tokens)
        super().__init__(
            f"The input ({count} tokens) is longer than the model's context length "
            f"({context_length} tokens)."
        )
