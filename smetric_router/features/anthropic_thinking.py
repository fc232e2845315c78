"""What an SGLang worker without a reasoning parser cannot take from an Anthropic Messages body.

SGLang 0.5.23 (entrypoints/anthropic/serving.py, serving_chat.apply_reasoning_enabled) refuses a
`thinking` that turns reasoning on (`enabled`, `adaptive`) with a 400 when the worker runs
without `--reasoning-parser`; `disabled` is accepted and changes nothing. Claude Code sends
`thinking: {"type": "adaptive"}` on every request, so against such workers it never gets an
answer. Without a parser the field changes nothing but that refusal: the chat template is not
switched, no reasoning is split out. So a body without it is served exactly as the worker serves
one that never had it, and the router's features, computed on the body it forwards, are the
worker's.

`context_management` is not in SGLang's request model (pydantic drops unknown fields), so the
worker ignores it either way; its `clear_thinking_*` edits are dropped with `thinking` because
they concern only thinking blocks, which a worker without a parser never writes. Other edits
(`clear_tool_uses_*`) pass as they came: they are the client's to keep, and the worker ignores
them as before.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

THINKING = "thinking"
CONTEXT_EDIT = "context_management.edits"
_THINKING_EDIT = re.compile(r"clear_thinking_\d{8}")
# SGLang's own message for the refusal (serving_chat.apply_reasoning_enabled)
REFUSAL = "Anthropic thinking is not supported for models without a reasoning parser"


def enables_reasoning(body: Mapping[str, Any]) -> bool:
    """Whether the body asks for reasoning (what a worker without a parser refuses); a type
    SGLang does not know is left for its validation to refuse."""
    thinking = body.get(THINKING)
    return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")


def drop_thinking(body: dict[str, Any]) -> list[str]:
    """Remove, in place, what a worker without a reasoning parser refuses or never uses: a
    reasoning-enabling `thinking` and `clear_thinking_*` context edits. Returns what was
    dropped, one entry per field or edit."""
    dropped: list[str] = []
    if enables_reasoning(body):
        del body[THINKING]
        dropped.append(THINKING)
    management = body.get("context_management")
    if isinstance(management, dict) and isinstance(management.get("edits"), list):
        edits = management["edits"]
        kept = [e for e in edits if not _is_thinking_edit(e)]
        dropped += [CONTEXT_EDIT] * (len(edits) - len(kept))
        if len(kept) < len(edits):
            rest = {k: v for k, v in management.items() if k != "edits"}
            if kept:
                body["context_management"] = {**rest, "edits": kept}
            elif rest:
                body["context_management"] = rest
            else:
                del body["context_management"]
    return dropped


def _is_thinking_edit(edit: object) -> bool:
    return isinstance(edit, dict) and bool(_THINKING_EDIT.fullmatch(str(edit.get("type", ""))))
