"""OpenAI-style error bodies: clients (the openai SDK, bench_serving) parse `error.message`."""

from __future__ import annotations

from collections.abc import Mapping

import orjson
from aiohttp import web


class RouterError(Exception):
    """An error the router answers itself, before or instead of a worker's reply."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.close = close  # end the client's connection too (frees its file descriptor)
        self.headers = dict(headers or {})
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code

    def body(self) -> dict[str, object]:
        return error_body(self.message, type_=self.type, param=self.param, code=self.code)

    def response(self) -> web.Response:
        resp = web.Response(
            status=self.status,
            body=orjson.dumps(self.body()),
            content_type="application/json",
            headers=self.headers,
        )
        if self.close:
            resp.force_close()
        return resp


def error_body(
    message: str,
    *,
    type_: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, object]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None) -> RouterError:
    return RouterError(400, message, param=param)


def no_worker(message: str = "no healthy worker is available") -> RouterError:
    return RouterError(503, message, type_="server_error", code="no_worker_available")


def openai_error_body(status: int, body: bytes) -> bytes | None:
    """A worker's error reply (status >= 400) in OpenAI's shape, or None when it is in it already.

    SGLang answers its OpenAI endpoints' errors as {"object": "error", "message", "type", "param",
    "code"} and others as {"error": "..."} or FastAPI's {"detail": ...}; the client gets one shape
    whichever it was (the router's own errors use it too)."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        obj = None
    type_: object = "invalid_request_error" if status < 500 else "server_error"
    param = code = None
    message: object
    if isinstance(obj, dict):
        err = obj.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return None
        if obj.get("object") == "error" or "message" in obj:
            message = obj.get("message")
            type_ = obj.get("type") if isinstance(obj.get("type"), str) else type_
            param = obj.get("param") if isinstance(obj.get("param"), str) else None
            code = obj.get("code") if isinstance(obj.get("code"), str) else None
        elif "error" in obj:
            message = err
        else:
            message = obj.get("detail", obj)
    else:
        message = body.decode("utf-8", errors="replace").strip() or None
    if not isinstance(message, str):
        message = f"HTTP {status}" if message is None else orjson.dumps(message).decode()
    return orjson.dumps(error_body(message, type_=str(type_), param=param, code=code))


def sse_error_event(message: str, code: str = "worker_lost") -> bytes:
    """The closing event of a stream whose worker went away, followed by the terminator."""
    body = error_body(message, type_="server_error", code=code)
    return b"data: " + orjson.dumps(body) + b"\n\ndata: [DONE]\n\n"


def worker_error_reply(status: int, body: bytes, content_type: str) -> tuple[bytes, str]:
    """(body, content type) to send for a worker's reply: error replies (status >= 400) in
    OpenAI's shape (openai_error_body), anything else as it came."""
    if status >= 400 and (fixed := openai_error_body(status, body)) is not None:
        return fixed, "application/json"
    return body, content_type
