"""The answer to a request admission refuses: HTTP 429 with Retry-After, in OpenAI's shape as
its rate limits answer (type "requests", code "rate_limit_exceeded"). The Responses API shares
that shape; on /v1/messages the router's Anthropic middleware turns it into Anthropic's
rate_limit_error (router/api_messages.py), keeping the headers."""

from __future__ import annotations

from smetric_router.admission.gate import Shed
from smetric_router.router.errors import RouterError

RATE_LIMIT_CODE = "rate_limit_exceeded"


def refusal(shed: Shed, retry_after: int) -> RouterError:
    return RouterError(
        429,
        f"The router is at capacity: {shed}. Retry after {retry_after} s.",
        type_="requests",
        code=RATE_LIMIT_CODE,
        headers={"Retry-After": str(retry_after), "x-smetric-shed": shed.reason},
    )
