"""What aiohttp's defaults do wrong with hostile or broken clients, set right for the router.

- An `Expect` header other than `100-continue` is answered 417 by aiohttp's default handler,
  which echoes the value into its body and fails with a 500 when the value is not UTF-8. Ours
  answers 417 without echoing it; the catch-all route gives unknown paths and methods the same
  handler (aiohttp's own 404/405 would use the default one).
- Malformed HTTP (bad header bytes, over-long lines, a body that fails its Content-Encoding) is
  answered 400 by aiohttp, which also logs it at ERROR with a traceback: any client could fill
  the log. Those records become one DEBUG line; the router's own failures keep their tracebacks.
- Every response names its server with versions (`Server: Python/3.11 aiohttp/3.x`), which only
  tells a scanner what to try: the router's responses carry no Server header. (aiohttp's own 400
  to bytes it cannot parse as a request still does: it is made below any hook an app has.)
"""

from __future__ import annotations

import logging

from aiohttp import HttpVersion11, hdrs, web, web_response
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from smetric_router.router.errors import RouterError

_CLIENT_FAULTS = (HttpProcessingError, RequestPayloadError)


async def expect_continue(request: web.Request) -> web.StreamResponse | None:
    if request.version != HttpVersion11:
        return None
    if request.headers.get(hdrs.EXPECT, "").lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the interim line is not part of the response
        return None
    return RouterError(
        417, "Only 'Expect: 100-continue' is supported.", code="expectation_failed"
    ).response()


async def handle_unrouted(request: web.Request) -> web.StreamResponse:
    """404, or 405 with Allow when another method serves the path, in OpenAI's shape."""
    mine = request.match_info.route.resource
    allowed: set[str] = set()
    for resource in request.app.router.resources():
        if resource is not mine:
            allowed |= (await resource.resolve(request))[1]
    if allowed:
        return RouterError(
            405,
            f"Method {request.method} is not allowed here; use {', '.join(sorted(allowed))}.",
            code="method_not_allowed",
            headers={hdrs.ALLOW: ",".join(sorted(allowed))},
        ).response()
    return RouterError(404, "There is no such endpoint.", code="not_found").response()


async def _drop_server(request: web.Request, response: web.StreamResponse) -> None:
    # aiohttp has set its default by now (on_response_prepare runs after it, before the write).
    response.headers.popall(hdrs.SERVER, None)


def hide_server(app: web.Application) -> None:
    """No Server header on the app's responses (all of them: the catch-all route answers what
    no other route does)."""
    app.on_response_prepare.append(_drop_server)


PRODUCT = "smetric-router"


def name_server_without_version() -> None:
    """For the router's own process: aiohttp answers a request it cannot parse (400) before any
    app sees it, so on_response_prepare cannot drop the Server header there, and aiohttp names
    itself and its version in it. Its process-wide default becomes the product's name alone.
    Process-wide, so only the router's process sets it (not a library or test that embeds the
    app beside servers of its own)."""
    web_response.SERVER_SOFTWARE = PRODUCT  # type: ignore[attr-defined]  # read at each answer


def add_catch_all(app: web.Application) -> None:
    app.router.add_route("*", "/{path:.*}", handle_unrouted, expect_handler=expect_continue)


class _ClientFaultFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, _CLIENT_FAULTS):
            return True
        logger = logging.getLogger(record.name)
        if not logger.isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.msg, record.args = "malformed request: %s", (str(exc).replace("\n", " "),)
        record.exc_info = record.exc_text = None
        return True


_FILTER = _ClientFaultFilter()


def quiet_client_faults() -> None:
    """Idempotent: the same filter is added once."""
    logging.getLogger("aiohttp.server").addFilter(_FILTER)
