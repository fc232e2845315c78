"""The session identifier a coding agent sends with each request, read as a routing hint.

Agents name their session in a header or a body field (sources in features/README.md, "Session
hints"). The router never needs one: turns are inferred from the request itself. A policy may
read the hint to keep a session's requests together where the cluster view alone leaves the
choice open (policies/session_home.py). Headers are read first, in the order of SESSION_HEADERS;
then the body's Anthropic `metadata.user_id` (its session part only) and OpenAI's
`prompt_cache_key`. A malformed value is ignored, never an error: a hint cannot fail a request.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from multidict import CIMultiDict, CIMultiDictProxy

# Most specific first: a client that sends several sends the same id in each.
SESSION_HEADERS = (
    "x-claude-code-session-id",  # Claude Code >= 2.1.86
    "x-session-id",  # OpenCode (non-OpenCode providers), a generic name others use
    "x-session-affinity",  # OpenCode, same value as x-session-id
    "x-opencode-session",  # OpenCode (its own providers)
    "session_id",  # Codex (its conversation id)
    "session-id",  # Codex, newer releases
    "conversation_id",  # Codex, older releases
)
# Longer values are not session ids; they are refused rather than hashed.
MAX_HINT_CHARS = 256
# Claude Code before its JSON metadata: "user_<hash>_account_<uuid>_session_<uuid>".
_LEGACY_SESSION = re.compile(r"_session_([0-9A-Za-z-]+)$")
_CASELESS = (CIMultiDictProxy, CIMultiDict)


def session_hint(headers: Mapping[str, str] | None, body: Mapping[str, Any]) -> str | None:
    """The request's session id, or None when it carries none."""
    if headers:
        if not isinstance(headers, _CASELESS):
            # HTTP header names have no case; a plain mapping's keys have (the server's own
            # header map looks up without case, and copying it cost every request)
            headers = {k.lower(): v for k, v in headers.items()}
        for name in SESSION_HEADERS:
            hint = _clean(headers.get(name))
            if hint is not None:
                return hint
    return _from_metadata(body.get("metadata")) or _clean(body.get("prompt_cache_key"))


def _from_metadata(metadata: object) -> str | None:
    """Anthropic metadata.user_id as Claude Code fills it: a JSON object with "session_id", or
    the legacy string ending in "_session_<uuid>". A plain user id names a user, not a session:
    not a hint (a user's sessions belong spread like anyone's)."""
    if not isinstance(metadata, dict):  # parsed JSON: an object is a dict
        return None
    user_id = metadata.get("user_id")
    if not isinstance(user_id, str) or len(user_id) > 4 * MAX_HINT_CHARS:
        return None
    if user_id.startswith("{"):
        try:
            parsed = json.loads(user_id)
        except ValueError:
            return None
        return _clean(parsed.get("session_id")) if isinstance(parsed, dict) else None
    match = _LEGACY_SESSION.search(user_id)
    return _clean(match.group(1)) if match else None


def _clean(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    value = value.strip()
    if not value or len(value) > MAX_HINT_CHARS:
        return None
    return value
