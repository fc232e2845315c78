"""RequestFeatures from OpenAI chat, OpenAI completions and SGLang /generate bodies.

Chat requests carry their history, so turn and est_hit are counted from the messages and a
follow-up costs only its new messages: token runs are cached per message, and the page-hash
chain state is cached per rendered message prefix, so the next turn extends the previous turn's
chain (page boundaries cross message boundaries: the state keeps the trailing partial page).
Raw prompts carry a turn only as a client hint (header or body field); without one, turn is None
and policies infer it from the cluster view (policies/turn.py).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from smetric_router.core.types import RequestFeatures
from smetric_router.features.chat import ChatCodec, content_text, message_role
from smetric_router.features.errors import FeatureError
from smetric_router.features.hashing import ChainState, as_u32

TURN_HEADER = "x-smetric-turn"
HISTORY_HEADER = "x-smetric-history-tokens"
HINT_FIELD = "smetric"
_PEEK = 32  # characters from each end of a message that go into its cache keys
_APPENDED = 8  # a follow-up is looked up as an earlier request plus up to this many messages

K = TypeVar("K")
V = TypeVar("V")


class _Lru(Generic[K, V]):
    def __init__(self, capacity: int) -> None:
        self._data: OrderedDict[K, V] = OrderedDict()
        self._capacity = capacity

    def get(self, key: K) -> V | None:
        try:
            self._data.move_to_end(key)
        except KeyError:
            return None
        return self._data[key]

    def put(self, key: K, value: V) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        if len(self._data) > self._capacity:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)


@dataclass(frozen=True, slots=True)
class _Prefix:
    """The page-hash chain and turn counts after a rendered message prefix.

    Hashes are stored once, as the segment each message completes, linked to the parent prefix:
    memory per conversation stays linear in its pages however many of its prefixes are cached.
    role and text identify the last message exactly (text is the object the run cache keeps).
    """

    chain: ChainState
    segment: array[int]  # signed int64 block hashes of the pages this message completed
    parent: _Prefix | None
    role: str = ""
    text: str = ""
    turns: int = 0  # assistant messages so far
    est_hit: int = 0  # rendered tokens through the last assistant message's <|im_end|>

    def page_hashes(self) -> array[int]:
        segments = []
        node: _Prefix | None = self
        while node is not None:
            segments.append(node.segment)
            node = node.parent
        out: array[int] = array("q")
        for segment in reversed(segments):
            out.extend(segment)
        return out

    def texts(self) -> list[str]:
        out = []
        node: _Prefix | None = self
        while node is not None and node.parent is not None:
            out.append(node.text)
            node = node.parent
        out.reverse()
        return out


def _peek(message: object) -> int:
    """A cheap fingerprint of a raw message (bounded work; equality is checked separately)."""
    if type(message) is not dict:
        return 0
    content = message.get("content")
    if type(content) is str:
        return hash((message.get("role"), len(content), content[:_PEEK], content[-_PEEK:]))
    return hash((message.get("role"), len(message), type(content).__name__))


def strip_hint(body: dict[str, Any]) -> bool:
    """Remove the router-only hint field from a body before forwarding; True if there was one."""
    if HINT_FIELD not in body:
        return False
    del body[HINT_FIELD]
    return True


class FeatureExtractor:
    """Computes RequestFeatures for one page size. Not thread-safe (one per event loop).

    cache_entries bounds each LRU cache (token runs per message; chain states per prefix).
    keep_text=False skips building RequestFeatures.text, which only `cache_aware` reads.
    RequestFeatures.page_hashes is an array('q') of signed int64 block hashes (do not mutate).
    Chat message objects are kept for comparison with the next turn: do not mutate them.
    """

    def __init__(
        self,
        codec: ChatCodec,
        page_size: int = 16,
        cache_entries: int = 4096,
        keep_text: bool = True,
    ) -> None:
        if page_size <= 0:
            raise ValueError(f"page_size must be > 0, got {page_size}")
        if cache_entries <= 0:
            raise ValueError(f"cache_entries must be > 0, got {cache_entries}")
        self.codec = codec
        self.page_size = page_size
        self.keep_text = keep_text
        self._runs: _Lru[tuple[str, str], array[int]] = _Lru(cache_entries)
        self._prefixes: _Lru[tuple[int, int], _Prefix] = _Lru(cache_entries)
        self._tips: _Lru[tuple[int, int], tuple[_Prefix, list[Any]]] = _Lru(cache_entries)
        self._root = _Prefix(ChainState(page_size), array("q"), None)
        self._newline_len = len(codec.encode("\n"))
        self._generation_prompt = as_u32(codec.generation_prompt)

    # -- chat -------------------------------------------------------------------------------

    def from_chat(self, body: Mapping[str, Any]) -> RequestFeatures:
        """turn = assistant messages; est_hit = rendered tokens through the last assistant
        message's <|im_end|> (what the worker that produced it cached), 0 on turn 0."""
        messages = _messages(body)
        n = len(messages)
        start, prefix, known = self._known_prefix(messages)
        for i in range(start, n):
            prefix = self._extend(prefix, messages[i], i)
        if start < n:
            # The known part is kept as the earlier request's objects: tips of one conversation
            # share its message texts, so the memory they retain stays linear in its size.
            self._tips.put((n, _peek(messages[-1])), (prefix, known + messages[start:]))
        final, tail = prefix.chain.extend(self._generation_prompt)
        hashes = prefix.page_hashes()
        hashes.extend(tail)
        return RequestFeatures(
            prompt_len=final.tokens,
            page_hashes=hashes,
            page_size=self.page_size,
            turn=prefix.turns,
            est_hit=prefix.est_hit,
            text="".join(prefix.texts()) if self.keep_text else "",
            model=_model(body),
        )

    def _known_prefix(self, messages: list[Any]) -> tuple[int, _Prefix, list[Any]]:
        """The longest earlier request that this one extends (a follow-up appends a few
        messages), confirmed by comparing the message lists in C: no per-message Python work
        and no hashing over the history."""
        n = len(messages)
        for k in range(n, max(0, n - _APPENDED), -1):
            tip = self._tips.get((k, _peek(messages[k - 1])))
            if tip is not None and tip[1] == messages[:k]:
                return k, tip[0], tip[1]
        return 0, self._root, []

    def _extend(self, prefix: _Prefix, message: Any, index: int) -> _Prefix:
        role = message_role(message, index)
        text = content_text(message, index)
        # Nodes are cached per message prefix so that a request forking an earlier one
        # mid-conversation rehashes only from the fork; a hit is confirmed exactly.
        key = (id(prefix), _peek(message))
        node = self._prefixes.get(key)
        if node is None or node.parent is not prefix or node.text != text or node.role != role:
            chain, new = prefix.chain.extend(self._run(role, text))
            assistant = role == "assistant"
            node = _Prefix(
                chain,
                array("q", new),
                prefix,
                role,
                text,
                prefix.turns + assistant,
                chain.tokens - self._newline_len if assistant else prefix.est_hit,
            )
            self._prefixes.put(key, node)
        return node

    def _run(self, role: str, text: str) -> array[int]:
        run = self._runs.get((role, text))
        if run is None:
            run = as_u32(self.codec.render_text(role, text))
            self._runs.put((role, text), run)
        return run

    # -- raw prompts ------------------------------------------------------------------------

    def from_completion(
        self, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> RequestFeatures:
        """/v1/completions: prompt is a string, token ids, or a batch of either; a batch is routed
        by its first prompt (the whole request goes to one worker)."""
        text, ids = _completion_prompt(body)
        return self._raw(body, headers, text, ids)

    def from_generate(
        self, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> RequestFeatures:
        """SGLang /generate: text or input_ids, single or batched; a batch is routed by its first
        input (the whole request goes to one worker)."""
        text, ids = _generate_prompt(body)
        return self._raw(body, headers, text, ids)

    def _raw(
        self,
        body: Mapping[str, Any],
        headers: Mapping[str, str] | None,
        text: str | None,
        ids: Sequence[int] | None,
    ) -> RequestFeatures:
        turn, history = _hint(body, headers)
        tokens = as_u32(self.codec.encode(text) if text is not None else ids or [])
        _, hashes = ChainState(self.page_size).extend(tokens)
        return RequestFeatures(
            prompt_len=len(tokens),
            page_hashes=array("q", hashes),
            page_size=self.page_size,
            turn=turn,
            est_hit=history,
            text=(text or "") if self.keep_text else "",
            model=_model(body),
        )

    # -- full token ids ---------------------------------------------------------------------

    def prompt_token_ids(self, body: Mapping[str, Any]) -> list[int]:
        """The prompt's token ids for any of the three body kinds, told apart by their fields."""
        if "messages" in body:
            return self.codec.render_messages(_messages(body), add_generation_prompt=True)
        if "prompt" in body:
            text, ids = _completion_prompt(body)
        else:
            text, ids = _generate_prompt(body)
        return self.codec.encode(text) if text is not None else list(ids or [])


# -- body parsing ---------------------------------------------------------------------------


def _messages(body: Mapping[str, Any]) -> list[Any]:
    if "messages" not in body:
        raise FeatureError("Missing required parameter: 'messages'.")
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise FeatureError("Invalid 'messages': expected a non-empty array of message objects.")
    return messages


def _model(body: Mapping[str, Any]) -> str | None:
    model = body.get("model")
    return model if isinstance(model, str) else None


def _completion_prompt(body: Mapping[str, Any]) -> tuple[str | None, list[int] | None]:
    if "prompt" not in body:
        raise FeatureError("Missing required parameter: 'prompt'.")
    return _prompt(body["prompt"], "prompt")


def _generate_prompt(body: Mapping[str, Any]) -> tuple[str | None, list[int] | None]:
    has_text = body.get("text") is not None
    has_ids = body.get("input_ids") is not None
    if has_text == has_ids:
        if body.get("input_embeds") is not None:
            raise FeatureError(
                "'input_embeds' requests cannot be routed: send 'text' or 'input_ids'."
            )
        raise FeatureError("Exactly one of 'text' or 'input_ids' is required.")
    if has_text:
        text, _ = _prompt(body["text"], "text", allow_ids=False)
        return text, None
    _, ids = _prompt(body["input_ids"], "input_ids", allow_text=False)
    return None, ids


def _prompt(
    value: object, field: str, allow_text: bool = True, allow_ids: bool = True
) -> tuple[str | None, list[int] | None]:
    """A single prompt, or the first of a batch."""
    if isinstance(value, list) and value and isinstance(value[0], (str, list)):
        value = value[0]
        field += "[0]"
    if allow_text and isinstance(value, str):
        return value, None
    if allow_ids and isinstance(value, list) and value and all(_is_token(t) for t in value):
        return None, value
    kinds = [k for k, ok in (("a string", allow_text), ("an array of token ids", allow_ids)) if ok]
    raise FeatureError(f"Invalid type for '{field}': expected {' or '.join(kinds)} (or a batch).")


def _is_token(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32


def _hint(body: Mapping[str, Any], headers: Mapping[str, str] | None) -> tuple[int | None, int]:
    """(turn, history tokens) from the body's "smetric" field, else from the headers."""
    hint = body.get(HINT_FIELD)
    if hint is not None:
        if not isinstance(hint, dict):
            raise FeatureError(f"Invalid type for '{HINT_FIELD}': expected an object.")
        turn = _count(hint.get("turn"), f"{HINT_FIELD}.turn")
        history = _count(hint.get("history_tokens"), f"{HINT_FIELD}.history_tokens")
    else:
        turn = _count(_header(headers, TURN_HEADER), TURN_HEADER)
        history = _count(_header(headers, HISTORY_HEADER), HISTORY_HEADER)
    return turn, history or 0


def _header(headers: Mapping[str, str] | None, name: str) -> str | None:
    if not headers:
        return None
    value = headers.get(name)
    if value is None:
        # plain dicts are case-sensitive; HTTP header names are not
        value = next((v for k, v in headers.items() if k.lower() == name), None)
    return value


def _count(value: object, field: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise FeatureError(f"Invalid '{field}': expected a non-negative integer.") from None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise FeatureError(f"Invalid '{field}': expected a non-negative integer.")
    return value
