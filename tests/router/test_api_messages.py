"""router/api_messages.py and the Anthropic parts of router/auth.py and proxy.py: error types by
status, which error bodies are rewritten, the stream-cut event, x-api-key checked on the Messages
paths only and never forwarded as such to workers."""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from smetric_router.router import api_messages
from smetric_router.router.auth import AuthPolicy, _upstream_line, check_inference
from smetric_router.router.drain import SHUTDOWN_CODE
from smetric_router.router.errors import RouterError, error_body
from smetric_router.router.proxy import forward_head


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error"),
     (404, "not_found_error"), (405, "invalid_request_error"), (413, "request_too_large"),
     (415, "invalid_request_error"), (429, "rate_limit_error"), (500, "api_error"),
     (502, "api_error"), (503, "overloaded_error"), (504, "api_error")],
)  # fmt: skip
def test_openai_error_bodies_become_anthropic_ones(status: int, kind: str) -> None:
    openai = json.dumps(error_body("no such model", code="model_not_found")).encode()
    fixed = api_messages.anthropic_error(status, openai)
    assert fixed is not None
    assert json.loads(fixed) == {
        "type": "error",
        "error": {"type": kind, "message": "no such model"},
    }


def test_anthropic_and_foreign_bodies_pass_unchanged() -> None:
    theirs = b'{"type":"error","error":{"type":"invalid_request_error","message":"x"}}'
    assert api_messages.anthropic_error(400, theirs) is None
    assert api_messages.anthropic_error(400, b"not json") is None
    assert api_messages.anthropic_error(400, b'{"error": "Unauthorized"}') is None


def test_errors_are_reshaped_on_messages_paths_only() -> None:
    for path, anthropic in [("/v1/messages", True), ("/v1/messages/count_tokens", True),
                            ("/v1/messagesX", False), ("/v1/chat/completions", False)]:  # fmt: skip
        refused = RouterError(503, "no healthy worker is available", code="x").response()
        resp = api_messages.shape_error(make_mocked_request("POST", path), refused)
        assert isinstance(resp, web.Response) and isinstance(resp.body, bytes)
        body = json.loads(resp.body)
        if anthropic:
            assert body["type"] == "error" and body["error"]["type"] == "overloaded_error"
        else:
            assert body["error"]["code"] == "x"


def test_stream_cut_event_is_anthropic_sse() -> None:
    event = api_messages.sse_error_event("worker lost", "worker_lost")
    name, data = event.decode().removesuffix("\n\n").split("\n")
    assert name == "event: error"
    assert json.loads(data.removeprefix("data: ")) == {
        "type": "error", "error": {"type": "api_error", "message": "worker lost"}}  # fmt: skip
    shutdown = api_messages.sse_error_event("bye", SHUTDOWN_CODE)
    assert b'"overloaded_error"' in shutdown
    assert api_messages.stream_dialect("/v1/chat/completions") == {}
    assert api_messages.stream_dialect("/v1/messages")["done"].endswith(b"\n\n")


def test_x_api_key_is_the_key_on_messages_paths_only() -> None:
    policy = AuthPolicy(api_key="k")
    check_inference(policy, make_mocked_request("POST", "/v1/messages", headers={"x-api-key": "k"}))
    with pytest.raises(RouterError) as e:
        check_inference(
            policy, make_mocked_request("POST", "/v1/messages", headers={"x-api-key": "no"})
        )
    assert e.value.status == 401
    with pytest.raises(RouterError) as e:
        req = make_mocked_request("POST", "/v1/chat/completions", headers={"x-api-key": "k"})
        check_inference(policy, req)
    assert e.value.status == 401


def test_x_api_key_reaches_workers_only_as_bearer_when_forwarding() -> None:
    req = make_mocked_request("POST", "/v1/messages", headers={"x-api-key": "client-key"})
    assert b"x-api-key" not in forward_head(req.raw_headers).lower()
    assert _upstream_line(AuthPolicy(api_key="client-key"), req) == b""
    forwarding = AuthPolicy(forward_authorization=True)
    assert _upstream_line(forwarding, req) == b"Authorization: Bearer client-key\r\n"
    worker_key = AuthPolicy(worker_api_key="w")
    assert _upstream_line(worker_key, req) == b"Authorization: Bearer w\r\n"
