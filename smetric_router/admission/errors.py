"""The answer to a request admission refuses: HTTP 429 with Retry-After, in OpenAI's shape as
its rate limits answer (type "requests" or "tokens", code "rate_limit_exceeded"). The Responses
API shares that shape; on /v1/messages the router's Anthropic middleware turns it into
Anthropic's rate_limit_error (router/api_messages.py), keeping the headers."""

from __future__ import annotations

from smetric_router.admission.buckets import REQUESTS, Refused
from smetric_router.admission.gate import Shed
from smetric_router.admission.metrics import RATE_LIMIT
from smetric_router.router.errors import RouterError

RATE_LIMIT_CODE = "rate_limit_exceeded"
SHED_HEADER = "x-smetric-shed"


def refusal(shed: Shed, retry_after: int) -> RouterError:
    return RouterError(
        429,
        f"The router is at capacity: {shed}. Retry after {retry_after} s.",
        type_="requests",
        code=RATE_LIMIT_CODE,
        headers={"Retry-After": str(retry_after), SHED_HEADER: shed.reason},
    )


def rate_limited(tenant: str, refused: Refused) -> RouterError:
    """A tenant over its requests or tokens per minute, or the router over its prompt tokens per
    second (admission/buckets.py)."""
    what = "requests" if refused.limit == REQUESTS else "prompt tokens"
    limit = (
        f"the router: {refused.per_minute / 60:g} {what} per second over all clients"
        if refused.router_wide
        else f"{tenant}: {refused.per_minute:g} {what} per minute"
    )
    return RouterError(
        429,
        f"Rate limit reached for {limit}. Retry after {refused.retry_after} s.",
        type_=refused.limit,
        code=RATE_LIMIT_CODE,
        headers={"Retry-After": str(refused.retry_after), SHED_HEADER: RATE_LIMIT},
    )
