"""Who may call what, and what a request must look like, before any handler runs.

Three kinds of endpoint:
- open: /health, /liveness, /readiness, /metrics (GET): probes and Prometheus carry no secrets;
  /dashboard (GET): the live page's static HTML, which holds no data (router/dashboard.py);
- admin: POST/DELETE /workers, /flush_cache, GET /dashboard/data (the page's data: every worker's
  address and state): --admin-api-key; without it, the --api-key; with no key at all, loopback
  clients only;
- inference: everything else (generation, /v1/models, GET /workers, /smetric/prefix_match):
  --api-key when one is set; with --api-key-file, any tenant's key, and the request carries its
  tenant (`tenant_of`) to admission (its rate limits, share of the queue and priority cap).
Keys are compared in constant time. A request that carries a body must declare it JSON (415
otherwise): a browser cannot send that cross-site without a CORS preflight, which the router never
grants; an admin request from a browser page of another origin is refused outright, as a bodiless
POST needs no preflight.

The client's Authorization header is not forwarded to workers (it is the router's key, not
theirs) unless --forward-authorization; --worker-api-key is sent instead. What goes upstream is
decided here and read by the proxies with `upstream_auth_line` / `upstream_auth_header`.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from dataclasses import dataclass, field
from enum import Enum

from aiohttp import web

from smetric_router.admission.tenants import Tenant, TenantTable
from smetric_router.router.api_messages import API_KEY_HEADER, is_messages
from smetric_router.router.errors import RouterError

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/health", "/liveness", "/readiness", "/metrics", "/dashboard"})
ADMIN_PATHS = frozenset({"/flush_cache", "/dashboard/data"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# The Authorization header line the proxies send to the worker (b"" = none).
_UPSTREAM: web.RequestKey[bytes] = web.RequestKey("smetric_upstream_auth", bytes)
# The tenant whose key the request carried (with --api-key-file only).
_TENANT: web.RequestKey[Tenant] = web.RequestKey("smetric_tenant", Tenant)
TENANT_HEADER = "x-smetric-tenant"


class Access(Enum):
    OPEN = "open"
    INFERENCE = "inference"
    ADMIN = "admin"


def access_of(method: str, path: str) -> Access:
    if path in OPEN_PATHS and method in ("GET", "HEAD"):
        return Access.OPEN
    if path in ADMIN_PATHS or (path == "/workers" and method in ("POST", "DELETE")):
        return Access.ADMIN
    return Access.INFERENCE


@dataclass(frozen=True, slots=True)
class AuthPolicy:
    api_key: str | None = field(default=None, repr=False)
    admin_api_key: str | None = field(default=None, repr=False)
    worker_api_key: str | None = field(default=None, repr=False)
    forward_authorization: bool = False
    tenants: TenantTable | None = field(default=None, repr=False)  # --api-key-file


def describe(policy: AuthPolicy) -> str:
    """One start-up log line: which keys guard what (never the keys)."""
    if policy.admin_api_key is not None:
        admin = "admin key"
    elif policy.api_key is not None:
        admin = "inference key"
    else:
        admin = "loopback clients only"
    upstream = (
        "worker key"
        if policy.worker_api_key is not None
        else "client's Authorization"
        if policy.forward_authorization
        else "none"
    )
    inference = "key" if policy.api_key is not None else "open"
    if policy.tenants is not None:
        inference = f"tenants' keys ({', '.join(policy.tenants.names)})"
    return f"inference endpoints: {inference}; admin endpoints: {admin}; to workers: {upstream}"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _token(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _same(given: str, key: str) -> bool:
    return hmac.compare_digest(given.encode(errors="surrogateescape"), key.encode())


def _is_loopback(remote: str | None) -> bool:
    try:
        ip = ipaddress.ip_address(remote or "")
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _unauthorized(message: str) -> RouterError:
    return RouterError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def _forbidden(message: str) -> RouterError:
    return RouterError(403, message, type_="permission_error", code="forbidden")


def _anthropic_key(request: web.Request) -> str | None:
    """The key an Anthropic client (Claude Code) sends in x-api-key, on the Messages paths."""
    return (request.headers.get(API_KEY_HEADER) or None) if is_messages(request.path) else None


def _client_key(request: web.Request) -> str:
    """The key an inference request carries; 401 when it carries none."""
    token = _token(request.headers.get("Authorization")) or _anthropic_key(request)
    if token is None:
        also = " (or 'x-api-key: KEY')" if is_messages(request.path) else ""
        raise _unauthorized(
            "You didn't provide an API key: send it as the header 'Authorization: Bearer KEY'"
            f"{also}."
        )
    return token


def check_inference(policy: AuthPolicy, request: web.Request) -> None:
    if policy.api_key is None:
        return
    if not _same(_client_key(request), policy.api_key):
        raise _unauthorized("Incorrect API key provided.")


def check_tenant(tenants: TenantTable, request: web.Request) -> Tenant:
    """The tenant whose key the request carries (--api-key-file); 401 as check_inference."""
    tenant = tenants.identify(_client_key(request))
    if tenant is None:
        raise _unauthorized("Incorrect API key provided.")
    return tenant


def tenant_of(request: web.Request) -> Tenant | None:
    """The request's tenant; None without --api-key-file (admission's "anonymous")."""
    return request.get(_TENANT)


async def tenant_header(request: web.Request, response: web.StreamResponse) -> None:
    """x-smetric-tenant: the tenant's name (never its key), with --api-key-file."""
    tenant = request.get(_TENANT)
    if tenant is not None:
        response.headers[TENANT_HEADER] = tenant.name


def check_admin(policy: AuthPolicy, request: web.Request) -> None:
    origin = request.headers.get("Origin")
    if origin is not None and origin != f"{request.scheme}://{request.host}":
        raise _forbidden("Admin endpoints refuse requests from browser pages of other origins.")
    key = policy.admin_api_key or policy.api_key
    if key is None:
        if not _is_loopback(request.remote):
            raise _forbidden(
                "Admin endpoints accept only loopback clients when the router has no "
                "--admin-api-key (or --api-key)."
            )
        return
    token = _token(request.headers.get("Authorization"))
    if token is None:
        raise _unauthorized(
            "This admin endpoint needs the admin API key: send 'Authorization: Bearer KEY'."
        )
    if not _same(token, key):
        raise _forbidden("This API key may not use admin endpoints.")


def check_json_body(request: web.Request) -> None:
    if request.method not in _BODY_METHODS or not request.body_exists:
        return
    if request.content_length == 0:
        return
    if request.content_type != "application/json":
        given = request.headers.get("Content-Type", "none")
        raise RouterError(
            415,
            f"Request bodies must be JSON: send 'Content-Type: application/json' (got {given!r}).",
            code="unsupported_media_type",
        )


def _upstream_line(policy: AuthPolicy, request: web.Request) -> bytes:
    if policy.worker_api_key is not None:
        return b"Authorization: Bearer %s\r\n" % policy.worker_api_key.encode()
    if policy.forward_authorization:
        # the first one only: a second Authorization header is not the client's key either
        for k, v in request.raw_headers:
            if k.lower() == b"authorization":
                return b"Authorization: %s\r\n" % v
        # SGLang's --api-key reads Authorization only: an Anthropic client's key goes as Bearer
        key = _anthropic_key(request)
        if key is not None:
            return b"Authorization: Bearer %s\r\n" % key.encode("latin-1", "replace")
    return b""


def upstream_auth_line(request: web.Request) -> bytes:
    """The Authorization header line (CRLF-ended, or b"") this request sends its worker."""
    line = request.get(_UPSTREAM)
    return line if isinstance(line, bytes) else b""


def upstream_auth_header(request: web.Request) -> dict[str, str]:
    """upstream_auth_line as a header dict, for aiohttp client calls."""
    line = upstream_auth_line(request).decode("latin-1")
    name, _, value = line.partition(":")
    return {name: value.strip()} if value else {}


def auth_refusal(policy: AuthPolicy, request: web.Request) -> web.Response | None:
    """The answer to a request that may not pass (its key, its body's type), else None, with
    its tenant and the worker's Authorization line kept on the request for later."""
    access = access_of(request.method, request.path)
    try:
        if access is Access.ADMIN:
            check_admin(policy, request)
        elif access is Access.INFERENCE and policy.tenants is not None:
            request[_TENANT] = check_tenant(policy.tenants, request)
        elif access is Access.INFERENCE:
            check_inference(policy, request)
        check_json_body(request)
    except RouterError as e:
        # debug only: a flood of bad keys must not flood the log
        log.debug("%s %s from %s refused: %d %s", request.method, request.path,
                  request.remote, e.status, e.message)  # fmt: skip
        return e.response()
    request[_UPSTREAM] = _upstream_line(policy, request)
    return None
