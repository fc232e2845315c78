"""Error replies in the shapes SGLang 0.5.23's FastAPI server writes them.

- OpenAI-style body `{"object": "error", "message", "type", "param": null, "code"}`: every error
  of the OpenAI endpoints, and on any endpoint a request that fails FastAPI's request validation
  (malformed JSON, a missing or ill-typed field), whose `type` is "Bad Request".
- /generate's own errors (checks of the parsed request): `{"error": {"message"}}`.
- An unknown path or method: FastAPI's `{"detail": "Not Found"}` / `{"detail": "Method Not
  Allowed"}` (JSON), not aiohttp's text.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web

VALIDATION = "Bad Request"  # the type SGLang gives request-validation errors


def json_response(obj: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


def openai_body(message: str, status: int, err_type: str = "BadRequestError") -> dict[str, object]:
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": status}


def openai_error(message: str, status: int, err_type: str = "BadRequestError") -> web.Response:
    return json_response(openai_body(message, status, err_type), status)


def generate_error(message: str, status: int = 400) -> web.Response:
    return json_response({"error": {"message": message}}, status)


class BadRequest(ValueError):
    """A request the emulator refuses with 400; `validation` marks what SGLang's request models
    reject before any handler runs (type "Bad Request", the OpenAI body on every endpoint)."""

    def __init__(self, message: str, validation: bool = False) -> None:
        super().__init__(message)
        self.validation = validation

    def response(self, generate: bool = False) -> web.Response:
        if self.validation:
            return openai_error(str(self), 400, VALIDATION)
        return generate_error(str(self)) if generate else openai_error(str(self), 400)


class InternalError(RuntimeError):
    """A request SGLang fails with 500 (an unexpected error while handling it): the OpenAI body
    with type "InternalServerError" and SGLang's "Internal server error: ..." message."""

    def response(self) -> web.Response:
        return openai_error(f"Internal server error: {self}", 500, "InternalServerError")


@web.middleware
async def fastapi_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed as exc:
        resp = json_response({"detail": "Method Not Allowed"}, 405)
        resp.headers["Allow"] = ", ".join(sorted(exc.allowed_methods))
        return resp
    except web.HTTPNotFound:
        return json_response({"detail": "Not Found"}, 404)
