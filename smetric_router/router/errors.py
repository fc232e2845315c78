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
    ) -> None:
        super().__init__(message)
        self.headers = dict(headers or {})
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code

    def body(self) -> dict[str, object]:
        return error_body(self.message, type_=self.type, param=self.param, code=self.code)

    def response(self) -> web.Response:
        return web.Response(
            status=self.status,
            body=orjson.dumps(self.body()),
            content_type="application/json",
            headers=self.headers,
        )


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


def sse_error_event(message: str, code: str = "worker_lost") -> bytes:
    """The closing event of a stream whose worker went away, followed by the terminator."""
    body = error_body(message, type_="server_error", code=code)
    return b"data: " + orjson.dumps(body) + b"\n\ndata: [DONE]\n\n"
