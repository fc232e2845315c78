"""Token limits refused at the router, as SGLang 0.5.23 refuses them (400), so that no worker
is handed a request it must refuse, or one whose answer could exhaust it:

- the completion budget (chat `max_completion_tokens` or else `max_tokens`, completions
  `max_tokens`, /generate `sampling_params.max_new_tokens`) must be a non-negative integer (a
  float with no fraction passes, as pydantic's lax int does) and at most the context length;
- the prompt must stay below the context length, and prompt plus budget within it
  (tokenizer_manager._validate_one_request).

The context length is the smallest one the request's candidate workers report (/v1/models
max_model_len), or --context-length; unknown: only the budget's type is checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from smetric_router.router.errors import RouterError, bad_request

CODE = "context_length_exceeded"  # OpenAI's code for a request past the context window


def _fields(endpoint: str) -> tuple[str, ...]:
    if endpoint == "/v1/chat/completions":
        return ("max_completion_tokens", "max_tokens")
    if endpoint == "/v1/completions":
        return ("max_tokens",)
    return ("max_new_tokens",)


def requested_tokens(endpoint: str, body: Mapping[str, Any]) -> tuple[str, int] | None:
    """(field, value) of the completion budget the body asks for, None when it sets none; a
    batched /generate with per-prompt sampling_params is held to the largest."""
    if endpoint == "/generate":
        params = body.get("sampling_params")
        found = [p for p in params if isinstance(p, dict)] if isinstance(params, list) else []
        if isinstance(params, dict):
            found = [params]
        asked = [_count(p.get("max_new_tokens"), "sampling_params.max_new_tokens") for p in found]
        given = [n for n in asked if n is not None]
        return ("max_new_tokens", max(given)) if given else None
    # SGLang reads `max_completion_tokens or max_tokens`: a 0 falls through to max_tokens
    chosen: tuple[str, int] | None = None
    for field in _fields(endpoint):
        n = _count(body.get(field), field)
        if n is not None and (chosen is None or chosen[1] == 0):
            chosen = (field, n)
    return chosen


def _count(value: object, field: str) -> int | None:
    if value is None:
        return None
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is not int or value < 0:
        raise bad_request(f"Invalid '{field}': expected a non-negative integer.", param=field)
    return value


def check_budget(asked: tuple[str, int] | None, context: int | None) -> None:
    """Before the prompt is read: the budget alone must fit the context."""
    if asked is None or context is None:
        return
    field, n = asked
    if n > context:
        raise RouterError(
            400,
            f"{field} is too large: {n}. This model supports at most {context} completion tokens.",
            param=field,
            code=CODE,
        )


def check_total(asked: tuple[str, int] | None, prompt_tokens: int, context: int | None) -> None:
    """Once the prompt is counted: prompt plus budget must fit the context."""
    if asked is None or context is None or prompt_tokens + asked[1] <= context:
        return
    field, n = asked
    raise RouterError(
        400,
        f"Requested token count exceeds the model's maximum context length of {context} "
        f"tokens. You requested a total of {prompt_tokens + n} tokens: {prompt_tokens} tokens "
        f"from the input messages and {n} tokens for the completion. Please reduce the number "
        "of tokens in the input messages or the completion to fit within the limit.",
        param=field,
        code=CODE,
    )


def too_long(message: str, endpoint: str, body: Mapping[str, Any]) -> RouterError:
    """The prompt reaches the context length."""
    params = {"/v1/chat/completions": "messages", "/v1/completions": "prompt"}
    param = params.get(endpoint, "input_ids" if body.get("input_ids") is not None else "text")
    return RouterError(400, message, param=param, code=CODE)
