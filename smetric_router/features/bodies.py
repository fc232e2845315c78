"""The fields of OpenAI chat, OpenAI completions and SGLang /generate bodies that the feature
extractor reads, with OpenAI-style errors (FeatureError) for malformed ones, and the client's
turn / history hints for raw prompts (the "smetric" body field, else the x-smetric-* headers).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from smetric_router.features.errors import FeatureError

TURN_HEADER = "x-smetric-turn"
HISTORY_HEADER = "x-smetric-history-tokens"
HINT_FIELD = "smetric"


def strip_hint(body: dict[str, Any]) -> bool:
    """Remove the router-only hint field from a body before forwarding; True if there was one."""
    if HINT_FIELD not in body:
        return False
    del body[HINT_FIELD]
    return True


def messages(body: Mapping[str, Any]) -> list[Any]:
    if "messages" not in body:
        raise FeatureError("Missing required parameter: 'messages'.")
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise FeatureError("Invalid 'messages': expected a non-empty array of message objects.")
    return messages


def model(body: Mapping[str, Any]) -> str | None:
    model = body.get("model")
    return model if isinstance(model, str) else None


def completion_prompt(body: Mapping[str, Any]) -> tuple[str | None, list[int] | None]:
    if "prompt" not in body:
        raise FeatureError("Missing required parameter: 'prompt'.")
    return _prompt(body["prompt"], "prompt")


def generate_prompt(body: Mapping[str, Any]) -> tuple[str | None, list[int] | None]:
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


def hint(body: Mapping[str, Any], headers: Mapping[str, str] | None) -> tuple[int | None, int]:
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
