"""RequestFeatures from OpenAI chat, OpenAI completions and SGLang /generate bodies.

Chat requests are rendered and tokenized as the SGLang workers do it, incrementally across the
turns of a conversation (chat_prompt); they carry their history, so turn and est_hit are counted
from the messages. Raw prompts are tokenized as SGLang tokenizes text prompts; they carry a turn
only as a client hint (header or body field); without one, turn is None and policies infer it
from the cluster view (policies/turn.py).
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from typing import Any

from smetric_router.core import tracing
from smetric_router.core.types import RequestFeatures
from smetric_router.features import anthropic_messages, bodies, openai_responses
from smetric_router.features.bodies import HINT_FIELD, HISTORY_HEADER, TURN_HEADER, strip_hint
from smetric_router.features.budget import UNLIMITED, Budget
from smetric_router.features.chat_prompt import ChatPrompts
from smetric_router.features.chat_tokenizer import ChatTokenizer
from smetric_router.features.hashing import as_u32, block_hash, page_digests

__all__ = ["HINT_FIELD", "HISTORY_HEADER", "TURN_HEADER", "FeatureExtractor", "strip_hint"]

DEFAULT_CACHE_BYTES = 512 << 20


class FeatureExtractor:
    """Computes RequestFeatures for one page size; thread-safe (chat_prompt.ChatPrompts).

    cache_entries / cache_bytes bound the earlier chat prompts kept for follow-ups.
    keep_text=False skips building RequestFeatures.text, which only `cache_aware` reads.
    keep_digests=True fills RequestFeatures.page_digests, which only the L3 view reads.
    RequestFeatures.page_hashes is an array('q') of signed int64 block hashes (do not mutate).
    Chat message objects are kept for comparison with the next turn: do not mutate them.
    A budget refuses prompts that reach the context (PromptTooLong) and tokenizing too much here
    (Offload); raw prompts need no state, chats share the extractor's earlier prompts.
    """

    def __init__(
        self,
        chat: ChatTokenizer,
        page_size: int = 16,
        cache_entries: int = 4096,
        keep_text: bool = True,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        keep_digests: bool = False,
    ) -> None:
        if page_size <= 0:
            raise ValueError(f"page_size must be > 0, got {page_size}")
        if cache_entries <= 0:
            raise ValueError(f"cache_entries must be > 0, got {cache_entries}")
        self.chat = chat
        self.page_size = page_size
        self.keep_text = keep_text
        self.keep_digests = keep_digests
        self._chats = ChatPrompts(chat, page_size, cache_entries, cache_bytes)

    # -- chat -------------------------------------------------------------------------------

    def from_chat(self, body: Mapping[str, Any], budget: Budget = UNLIMITED) -> RequestFeatures:
        """turn = assistant messages; est_hit = leading prompt tokens of the conversation through
        the last assistant message (what the worker that produced it cached), 0 on turn 0."""
        prompt = self._chats.prompt(body, budget)
        return RequestFeatures(
            prompt_len=prompt.n_ids,
            page_hashes=prompt.hashes,
            page_size=self.page_size,
            turn=prompt.turns,
            est_hit=prompt.history,
            text=prompt.text if self.keep_text else "",
            model=bodies.model(body),
            page_digests=prompt.page_digests() if self.keep_digests else b"",
        )

    # -- Anthropic Messages ---------------------------------------------------------------

    def messages_chat(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The chat body SGLang renders for an Anthropic Messages body (anthropic_messages)."""
        inline = anthropic_messages.supports_inline_system(self.chat.template)
        return anthropic_messages.chat_body(body, inline)

    def responses_chat(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The chat body SGLang renders for an OpenAI Responses body (openai_responses)."""
        inline = anthropic_messages.supports_inline_system(self.chat.template)
        return openai_responses.chat_body(body, inline)

    # -- raw prompts ------------------------------------------------------------------------

    def from_completion(
        self,
        body: Mapping[str, Any],
        headers: Mapping[str, str] | None = None,
        budget: Budget = UNLIMITED,
    ) -> RequestFeatures:
        """/v1/completions: prompt is a string, token ids, or a batch of either; a batch is routed
        by its first prompt (the whole request goes to one worker)."""
        text, ids = bodies.completion_prompt(body)
        return self._raw(body, headers, text, ids, budget)

    def from_generate(
        self,
        body: Mapping[str, Any],
        headers: Mapping[str, str] | None = None,
        budget: Budget = UNLIMITED,
    ) -> RequestFeatures:
        """SGLang /generate: text or input_ids, single or batched; a batch is routed by its first
        input (the whole request goes to one worker)."""
        text, ids = bodies.generate_prompt(body)
        return self._raw(body, headers, text, ids, budget)

    def _raw(
        self,
        body: Mapping[str, Any],
        headers: Mapping[str, str] | None,
        text: str | None,
        ids: Sequence[int] | None,
        budget: Budget,
    ) -> RequestFeatures:
        turn, history = bodies.hint(body, headers)
        if text is not None:
            with tracing.span("tokenize"):
                tokens = as_u32(self.chat.tokenizer.encode_text(text, budget))
        else:
            tokens = as_u32(ids or [])
        with tracing.span("hash"):
            digests = page_digests(tokens, self.page_size)
            hashes = array("q", (block_hash(d) for d in digests))
        return RequestFeatures(
            prompt_len=len(tokens),
            page_hashes=hashes,
            page_size=self.page_size,
            turn=turn,
            est_hit=history,
            text=(text or "") if self.keep_text else "",
            model=bodies.model(body),
            page_digests=b"".join(digests) if self.keep_digests else b"",
        )

    # -- full token ids ---------------------------------------------------------------------

    def prompt_token_ids(self, body: Mapping[str, Any], budget: Budget = UNLIMITED) -> list[int]:
        """The prompt's token ids for any of the three body kinds, told apart by their fields."""
        if "messages" in body:
            return self._chats.prompt(body, budget).token_ids()
        if "prompt" in body:
            text, ids = bodies.completion_prompt(body)
        else:
            text, ids = bodies.generate_prompt(body)
        if text is None:
            return list(ids or [])
        return self.chat.tokenizer.encode_text(text, budget)
