"""The Anthropic Messages API's HTTP specifics (/v1/messages, /v1/messages/count_tokens).

Routing, proxying, retries, limits and drain are the chat path's (the body's features come from
the chat body SGLang builds of it, features/anthropic_messages.py). What differs is here:

- errors the router answers itself on these paths are in Anthropic's shape,
  {"type": "error", "error": {"type", "message"}}, the type taken from the HTTP status as
  Anthropic and SGLang's Anthropic endpoint name them (a worker's own Anthropic errors pass);
- a stream cut mid-way (worker lost or stalled, router shutting down) ends with an Anthropic
  `event: error` SSE event instead of OpenAI's `data: {"error": ...}` and `[DONE]`;
- count_tokens is answered by the router itself: it renders and tokenizes the request exactly as
  the workers do (the golden test's guarantee), so asking a worker would only add a hop and load
  a worker with a request it answers from the same template and tokenizer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from smetric_router.router.drain import SHUTDOWN_CODE

log = logging.getLogger(__name__)

PREFIX = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"
API_KEY_HEADER = "x-api-key"  # what Anthropic clients (Claude Code) send their key in

# Anthropic's error types by HTTP status (its API's own table; 503 as SGLang's endpoint says it)
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
# Anthropic's stream end (SGLang's too): a cut after it is no cut for the client
STREAM_END = b'data: {"type":"message_stop"}\n\n'


def is_messages(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def error_type(status: int) -> str:
    if status in _TYPES:
        return _TYPES[status]
    return "invalid_request_error" if status < 500 else "api_error"


def error_body(status: int, message: str) -> bytes:
    err = {"type": error_type(status), "message": message}
    return orjson.dumps({"type": "error", "error": err})


def anthropic_error(status: int, body: bytes) -> bytes | None:
    """An OpenAI-shaped error body ({"error": {"message", ...}}) in Anthropic's shape; None when
    it is in Anthropic's already, or not an error body the router recognizes."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or obj.get("type") == "error":
        return None
    err = obj.get("error")
    if not isinstance(err, dict) or not isinstance(err.get("message"), str):
        return None
    return error_body(status, err["message"])


def shape_error(request: web.Request, resp: web.StreamResponse) -> web.StreamResponse:
    """An error answer on a Messages path in Anthropic's shape, whichever layer made it (auth,
    body checks, limits, the catch-all's 404/405, routing and proxy errors); run on every
    answer by the app's one middleware."""
    if resp.status < 400 or resp.prepared or not is_messages(request.path):
        return resp
    if isinstance(resp, web.Response) and isinstance(resp.body, bytes):
        fixed = anthropic_error(resp.status, resp.body)
        if fixed is not None:
            resp.body = fixed
            resp.content_type = "application/json"
    return resp


def sse_error_event(message: str, code: str = "worker_lost") -> bytes:
    """The closing event of a Messages stream that was cut (no [DONE]: Anthropic has none)."""
    kind = "overloaded_error" if code == SHUTDOWN_CODE else "api_error"
    data = orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})
    return b"event: error\ndata: " + data + b"\n\n"


def stream_dialect(path: str) -> dict[str, Any]:
    """copy_stream's keyword arguments for a stream on this path (none: OpenAI's)."""
    if not is_messages(path):
        return {}
    event: Callable[[str, str], bytes] = sse_error_event
    return {"error_event": event, "done": STREAM_END}


def count_tokens_reply(input_tokens: int) -> web.Response:
    return web.Response(
        body=orjson.dumps({"input_tokens": input_tokens}), content_type="application/json"
    )
