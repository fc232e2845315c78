"""What the router drops from a Messages body for workers without a reasoning parser: a
reasoning-enabling `thinking` and clear_thinking context edits, nothing else."""

from __future__ import annotations

import copy
from typing import Any

from smetric_router.features.anthropic_thinking import (
    CONTEXT_EDIT,
    THINKING,
    drop_thinking,
    enables_reasoning,
)

CLAUDE_CODE: dict[str, Any] = {
    "model": "m",
    "max_tokens": 32000,
    "messages": [{"role": "user", "content": "Fix the bug."}],
    "metadata": {"user_id": '{"session_id": "s"}'},
    "thinking": {"type": "adaptive", "display": "omitted"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "high"},
    "stream": True,
}


def test_claude_codes_thinking_and_its_edit_are_dropped_and_nothing_else() -> None:
    body = copy.deepcopy(CLAUDE_CODE)
    assert drop_thinking(body) == [THINKING, CONTEXT_EDIT]
    expected = {k: v for k, v in CLAUDE_CODE.items() if k not in ("thinking", "context_management")}
    assert body == expected
    assert drop_thinking(body) == []  # idempotent


def test_enabled_is_dropped_disabled_kept() -> None:
    enabled = {**CLAUDE_CODE, "thinking": {"type": "enabled", "budget_tokens": 2048}}
    assert enables_reasoning(enabled)
    assert THINKING in drop_thinking(enabled) and THINKING not in enabled
    unknown = {"model": "m", "thinking": {"type": "later"}}  # SGLang's validation refuses it
    assert not enables_reasoning(unknown) and drop_thinking(unknown) == []
    disabled = {"model": "m", "thinking": {"type": "disabled"}}
    assert not enables_reasoning(disabled)
    assert drop_thinking(disabled) == [] and disabled["thinking"] == {"type": "disabled"}


def test_other_context_edits_and_keys_pass() -> None:
    tools_edit = {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens"}}
    body: dict[str, Any] = {
        "context_management": {
            "edits": [{"type": "clear_thinking_20251015"}, tools_edit],
            "other": 1,
        }
    }
    assert drop_thinking(body) == [CONTEXT_EDIT]
    assert body == {"context_management": {"edits": [tools_edit], "other": 1}}
    only_thinking: dict[str, Any] = {
        "context_management": {"edits": [{"type": "clear_thinking_20251015"}], "x": 2}
    }
    assert drop_thinking(only_thinking) == [CONTEXT_EDIT]
    assert only_thinking == {"context_management": {"x": 2}}
    odd: dict[str, Any] = {"context_management": {"edits": "all"}, "thinking": "yes"}
    assert drop_thinking(odd) == [] and odd == {
        "context_management": {"edits": "all"},
        "thinking": "yes",
    }
