"""The session ids coding agents send, read from headers and bodies (features/session_hint.py)."""

from __future__ import annotations

import json

import pytest
from multidict import CIMultiDict

from smetric_router.features.session_hint import MAX_HINT_CHARS, session_hint

SID = "54c1eb09-bc4c-4d2f-98eb-6d2ab2d5e2fe"


@pytest.mark.parametrize(
    "header",
    [
        "X-Claude-Code-Session-Id",  # Claude Code
        "session_id",  # Codex
        "session-id",  # Codex, newer
        "conversation_id",  # Codex, older
        "x-session-affinity",  # OpenCode
        "X-Session-Id",  # OpenCode
        "x-opencode-session",  # OpenCode's own providers
    ],
)
def test_each_agent_header_is_read_whatever_its_case(header: str) -> None:
    assert session_hint({header: SID}, {}) == SID  # a plain dict: case-sensitive keys
    assert session_hint(CIMultiDict({header.upper(): SID}), {}) == SID


def test_claude_code_header_wins_over_the_others_and_the_body() -> None:
    headers = {"x-session-affinity": "other", "x-claude-code-session-id": SID}
    assert session_hint(headers, {"prompt_cache_key": "key"}) == SID


def test_body_fields_when_no_header() -> None:
    # Claude Code's metadata.user_id: its JSON form, and its legacy string form
    meta = {"user_id": json.dumps({"device_id": "d", "account_uuid": "", "session_id": SID})}
    assert session_hint({}, {"metadata": meta}) == SID
    legacy = {"user_id": f"user_{'ab' * 32}_account_{SID}_session_{SID[::-1]}"}
    assert session_hint({}, {"metadata": legacy}) == SID[::-1]
    # Codex sets prompt_cache_key to its conversation id
    assert session_hint({}, {"prompt_cache_key": SID}) == SID
    assert session_hint({}, {"metadata": meta, "prompt_cache_key": "k"}) == SID


@pytest.mark.parametrize(
    "headers, body",
    [
        ({}, {}),
        ({"x-claude-code-session-id": "   "}, {}),
        ({"session_id": "x" * (MAX_HINT_CHARS + 1)}, {}),
        ({}, {"metadata": {"user_id": "alice"}}),  # a user, not a session
        ({}, {"metadata": {"user_id": "{not json"}}),
        ({}, {"metadata": {"user_id": "[1, 2]"}}),
        ({}, {"metadata": "session"}),
        ({}, {"prompt_cache_key": 42}),
        ({"authorization": "Bearer k", "user-agent": "claude-cli/2.1"}, {"user": "alice"}),
    ],
)
def test_no_hint_and_malformed_ones_are_none_never_an_error(
    headers: dict[str, str], body: dict[str, object]
) -> None:
    assert session_hint(headers, body) is None


def test_values_are_trimmed() -> None:
    assert session_hint({"session_id": f"  {SID}\t"}, {}) == SID
