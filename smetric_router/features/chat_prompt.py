"""Chat requests rendered and tokenized exactly as SGLang does it (chat_tokenizer), fast for the
follow-ups of a conversation.

Each request is rendered whole with the model's template (templates may rewrite earlier turns,
so nothing short of rendering is exact), then tokenized and hashed only from the last cut point
before the first character that differs from an earlier rendered prompt (rendered.render_from).
The earlier prompt is found from the messages: a follow-up repeats an earlier request's message
list and appends a few messages, which is confirmed by comparing the lists in C, and the
template-ready form of those known messages is reused. When none of the last few requests of its
conversation came here (router replicas behind one address each see a share of a conversation's
turns), the latest one that did is found by the conversation's first two messages, so only the
turns since are tokenized, not the whole history. A first turn starts from the last prompt
that began with the same first message (a shared system prompt and tools).

History (est_hit): the conversation through its last assistant message, as the template renders
it when that message is the last one and no generation prompt follows; counted as the ids of
the prompt up to the last cut point (the end of an added token such as <|im_end|>) within the
text the two renderings share. That is a prefix of the prompt by construction, even for
templates that render a final assistant turn differently (Qwen3 keeps its reasoning until a
user turn follows); for ChatML-style templates it ends at that message's <|im_end|>.
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from smetric_router.core import tracing
from smetric_router.features import bodies
from smetric_router.features.budget import UNLIMITED, Budget
from smetric_router.features.chat_tokenizer import ChatTokenizer
from smetric_router.features.hashing import as_u32, page_digests, page_hashes
from smetric_router.features.loop_reuse import Loops
from smetric_router.features.rendered import Rendered, render_from, truncated
from smetric_router.features.sglang_chat import (
    Message,
    final_turn,
    hosts_tools,
    request_tools,
    template_kwargs,
    tool_result_order,
)

_PEEK = 32  # characters from each end of a message that go into its cache key
_APPENDED = 8  # a follow-up is looked up as an earlier request plus up to this many messages
_STARTS = 64  # first-message entries kept for first turns
_OPENING = 2  # messages that name a conversation: its system prompt and first task
_START_CHARS = 1 << 16  # of which the rendered beginning is kept

K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    rendered: Rendered  # the rendered prompt (without a continued final assistant message)
    appended: array[int]  # ids of a continued final assistant message
    hashes: array[int]  # signed int64 block hashes of the prompt's full pages
    text: str  # the rendered prompt's text
    turns: int  # assistant messages in the request
    history: int  # est_hit: leading ids of the conversation through the last assistant message

    @property
    def n_ids(self) -> int:
        return self.rendered.n_ids + len(self.appended)

    def token_ids(self) -> list[int]:
        ids = self.rendered.token_ids()
        ids.extend(self.appended)
        return ids.tolist()

    def page_digests(self) -> bytes:
        """Chain digests of the full pages (32 bytes each), the L3 keys' source."""
        if not self.appended:
            return self.rendered.page_digests()
        return b"".join(page_digests(self.token_ids(), self.rendered.page_size))


@dataclass(frozen=True, slots=True)
class _Tip:
    messages: list[Any]  # the request's messages (compared with later requests; never mutated)
    ready: list[Message]  # their template-ready form
    rendered: Rendered
    turns: int  # assistant messages among them
    last: int  # index of the last one, -1 for none
    hosted: bool  # whether one of them carries tools of its own
    loops: Loops | None  # the loops of its prompt's render, for reuse by the next render


class _Tips:
    """Earlier requests by (message count, last message fingerprint), least recently used
    dropped first, bounded in entries and in bytes: each distinct rendered prompt the entries
    hold counts once with its whole chain (chains shared by several prompts count for each)
    and its messages, and each distinct render's loops with their text."""

    def __init__(self, entries: int, max_bytes: int) -> None:
        self._data: OrderedDict[tuple[int, int], _Tip] = OrderedDict()
        self._held: dict[int, int] = {}  # id(rendered) -> entries holding it
        self._entries = entries
        self._max_bytes = max_bytes
        self._bytes = 0

    def get(self, key: tuple[int, int]) -> _Tip | None:
        tip = self._data.get(key)
        if tip is not None:
            self._data.move_to_end(key)
        return tip

    def put(self, key: tuple[int, int], tip: _Tip) -> None:
        old = self._data.pop(key, None)
        if old is not None:
            self._release(old)
        self._data[key] = tip
        for held, size in _held(tip):
            count = self._held.get(held, 0)
            if not count:
                self._bytes += size
            self._held[held] = count + 1
        while len(self._data) > 1 and (
            len(self._data) > self._entries or self._bytes > self._max_bytes
        ):
            _, dropped = self._data.popitem(last=False)
            self._release(dropped)

    def _release(self, tip: _Tip) -> None:
        for held, size in _held(tip):
            count = self._held[held] - 1
            if count:
                self._held[held] = count
            else:
                del self._held[held]
                self._bytes -= size

    def __len__(self) -> int:
        return len(self._data)

    @property
    def bytes(self) -> int:
        return self._bytes


def _held(tip: _Tip) -> list[tuple[int, int]]:
    """The objects an entry holds that count towards the bytes: (id, bytes)."""
    # the messages it was rendered from hold about as many characters as the prompt's text
    held = [(id(tip.rendered), tip.rendered.total + tip.rendered.length)]
    if tip.loops is not None:
        held.append((id(tip.loops), tip.loops.bytes))
    return held


def _put_newest(entries: OrderedDict[K, V], key: K, value: V, limit: int) -> None:
    """entries[key] = value as the most recent entry, the least recent dropped beyond limit."""
    entries[key] = value
    entries.move_to_end(key)
    if len(entries) > limit:
        entries.popitem(last=False)


def _opening(messages: list[Any]) -> tuple[int, ...]:
    return tuple(_peek(m) for m in messages[:_OPENING])


def _peek(message: object) -> int:
    """A cheap fingerprint of a raw message (bounded work; equality is checked separately)."""
    if type(message) is not dict:
        return 0
    content, role = message.get("content"), message.get("role")
    if type(role) is not str:  # any JSON from a client, maybe unhashable: validated later
        role = type(role).__name__
    if type(content) is str:
        return hash((role, len(content), content[:_PEEK], content[-_PEEK:]))
    return hash((role, len(message), type(content).__name__))


class ChatPrompts:
    """Thread-safe: prompts are made in parallel (rendering and tokenizing read only immutable
    earlier results); only finding an earlier request and remembering this one take the lock,
    so a request made while its predecessor is still being made starts from an older one (more
    to tokenize, the same result). Message objects of a request are kept for comparison with
    later ones: do not mutate them."""

    def __init__(
        self, chat: ChatTokenizer, page_size: int, cache_entries: int, cache_bytes: int
    ) -> None:
        self.chat = chat
        self.page_size = page_size
        self._tips = _Tips(cache_entries, cache_bytes)
        self._starts: OrderedDict[int, Rendered] = OrderedDict()
        # a conversation's opening -> the key of its latest request's entry in _tips
        self._latest: OrderedDict[tuple[int, ...], tuple[int, int]] = OrderedDict()
        self._latest_entries = cache_entries
        self._lock = threading.Lock()

    def prompt(self, body: Mapping[str, Any], budget: Budget = UNLIMITED) -> ChatPrompt:
        messages = bodies.messages(body)
        n = len(messages)
        with self._lock:
            known, tip = self._known(messages)
            start = None if tip is not None else self._starts.get(_peek(messages[0]))
        ready = tip.ready[:known] if tip is not None else []
        chat = self.chat
        ready += [chat.message(m, i) for i, m in enumerate(messages[known:], start=known)]
        order = tool_result_order(messages) if chat.traits.pairs_tool_results_by_id else None
        rendered_messages = [ready[i] for i in order] if order is not None else ready
        final, continued = final_turn(rendered_messages, bool(body.get("continue_final_message")))
        hosted = tip.hosted if tip is not None else False
        hosted = hosted or any(hosts_tools(m) for m in ready[known:])
        tools = request_tools(body, hosted)
        kwargs = template_kwargs(body)
        # the loop iterations the previous prompt's render shares with this one are reused
        with tracing.span("render") as span:
            text, loops = chat.render_reusing(
                final,
                tools,
                kwargs,
                True,
                tip.loops if tip is not None else None,
                tip.rendered if tip is not None else None,  # whose prompt begins with its text
            )
            span.set("smetric.chars", len(text))
        base = tip.rendered if tip is not None else start
        # tokenizing and hashing go together: both only from where the text differs from base's
        with tracing.span("tokenize_hash") as span:
            rendered, shared = render_from(chat.tokenizer, text, self.page_size, base, budget)
            span.set("smetric.reused_chars", shared)
        shares_base = base is not None and shared == base.length

        turns, last = (tip.turns, tip.last) if tip is not None else (0, -1)
        for i in range(known, n):
            if ready[i]["role"] == "assistant":
                turns, last = turns + 1, i
        history = 0
        if last >= 0:
            try:
                with tracing.span("render_history"):
                    shared = chat.shared_prefix(
                        rendered_messages[: last + 1], tools, kwargs, False, loops, text
                    )
            except ValueError:  # a template that refuses to end on an assistant turn
                shared = 0
            history = rendered.tokens_through(shared)

        new = _Tip(messages, ready, rendered, turns, last, hosted, loops)
        with self._lock:
            self._remember(messages, known, tip, new, shares_base)
        if continued is None:
            return ChatPrompt(rendered, as_u32(()), rendered.page_hashes(), text, turns, history)
        appended = as_u32(self._continuation(continued, budget, rendered.n_ids))
        ids = rendered.token_ids()
        ids.extend(appended)
        hashes = array("q", page_hashes(ids, self.page_size))
        return ChatPrompt(rendered, appended, hashes, text, turns, history)

    def _continuation(self, text: str, budget: Budget, before: int) -> list[int]:
        """SGLang appends a continued final assistant message as its own encoding, less a BOS."""
        ids = self.chat.tokenizer.encode_text(text, budget, before)
        if ids and ids[0] == self.chat.tokenizer.bos_id:
            ids = ids[1:]
        return ids

    def _known(self, messages: list[Any]) -> tuple[int, _Tip | None]:
        """The longest earlier request that this one extends, confirmed by comparing the
        message lists in C: no per-message Python work and no hashing over the history."""
        n = len(messages)
        for k in range(n, max(0, n - _APPENDED), -1):
            tip = self._tips.get((k, _peek(messages[k - 1])))
            if tip is not None and tip.messages == messages[:k]:
                return k, tip
        if n > _OPENING:
            key = self._latest.get(_opening(messages))
            if key is not None and key[0] <= n - _APPENDED:
                tip = self._tips.get(key)
                if tip is not None and tip.messages == messages[: key[0]]:
                    return key[0], tip
        return 0, None

    def _remember(
        self, messages: list[Any], known: int, tip: _Tip | None, new: _Tip, shares_base: bool
    ) -> None:
        n = len(messages)
        rendered = new.rendered
        if tip is not None and tip.rendered is not rendered and shares_base:
            # the earlier prompt is a prefix of this one: its entry can share this one's ids
            # (a retry of it then tokenizes only its generation prompt)
            self._tips.put((known, _peek(messages[known - 1])), replace(tip, rendered=rendered))
        if tip is None or known < n or tip.rendered is not rendered:
            # the known messages are kept as the earlier request's objects, so entries of one
            # conversation share its message objects
            kept = (tip.messages if tip is not None else []) + messages[known:]
            key = (n, _peek(messages[-1]))
            self._tips.put(key, replace(new, messages=kept))
            if n > _OPENING:
                _put_newest(self._latest, _opening(messages), key, self._latest_entries)
        if tip is None:
            _put_newest(
                self._starts, _peek(messages[0]), truncated(rendered, _START_CHARS), _STARTS
            )
