"""The OpenAI Responses API's HTTP specifics (POST /v1/responses, GET /v1/responses/{id},
POST /v1/responses/{id}/cancel).

A stored response lives only in the memory of the worker that made it (SGLang's response_store,
--enable-response-store), so a request continuing it (previous_response_id), and GET / cancel of
it, must reach that worker. The router stays stateless by making the ids it hands out say where
they live: the worker's own id (`resp_...`) leaves the router as

    resp_ + base64url(worker tag (8) || worker's id || HMAC-SHA256(key, tag || id)[:12])

where the tag is a hash of the worker's URL. On the way in the router checks the MAC (a forged,
foreign or mangled id is a 400), finds the worker by its tag (one no longer registered or
healthy: 404, the response is gone with it) and sends the worker its own id. The key is
--response-id-key / $SMETRIC_RESPONSE_ID_KEY, shared by router replicas that must accept each
other's ids; without it a random key per router (its --processes replicas share it): ids then
die with the router.

Requests without previous_response_id are routed as the chat request SGLang renders for them
(features/openai_responses.py); with it, to the holder (reason `response-holder`), whatever its
load, with no retry elsewhere: no other worker has the history.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import secrets
from collections.abc import Mapping
from typing import Any, Protocol

import aiohttp
import orjson
from aiohttp import web

from smetric_router.router.errors import RouterError
from smetric_router.router.workers import Worker, WorkerRegistry

log = logging.getLogger(__name__)

PREFIX = "/v1/responses"
HOLDER_REASON = "response-holder"
BY_ID_LABEL = "/v1/responses/{id}"  # GET and cancel, in the request metrics
RESPONSE_ID_KEY_ENV = "SMETRIC_RESPONSE_ID_KEY"
ID_PREFIX = "resp_"  # SGLang's and OpenAI's
_TAG, _MAC = 8, 12  # bytes: a worker tag collision among a cluster's URLs is 2^-64-unlikely
_LIFECYCLE = b'"response":'  # the events that carry the response object (created, completed...)


def is_responses(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


class ResponseIds:
    """Encodes worker response ids into the router's and back (module docstring)."""

    def __init__(self, key: str | None) -> None:
        self.random = key is None
        self.key_text = secrets.token_urlsafe(32) if key is None else key
        self._key = self.key_text.encode()
        if self.random:
            log.info(
                "responses: ids signed with a random per-router key (no --response-id-key or "
                "$%s): they are valid only until this router stops, and only here",
                RESPONSE_ID_KEY_ENV,
            )

    @staticmethod
    def tag(url: str) -> bytes:
        return hashlib.sha256(url.encode()).digest()[:_TAG]

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self._key, payload, hashlib.sha256).digest()[:_MAC]

    def encode(self, worker_url: str, worker_id: str) -> str:
        payload = self.tag(worker_url) + worker_id.encode()
        token = base64.urlsafe_b64encode(payload + self._mac(payload)).rstrip(b"=")
        return ID_PREFIX + token.decode()

    def decode(self, token: object) -> tuple[bytes, str] | None:
        """(worker tag, the worker's id); None when this router did not issue the id."""
        if not isinstance(token, str) or not token.startswith(ID_PREFIX) or not token.isascii():
            return None
        text = token[len(ID_PREFIX) :]
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError):
            return None
        if len(raw) <= _TAG + _MAC:
            return None
        payload, mac = raw[:-_MAC], raw[-_MAC:]
        if not hmac.compare_digest(mac, self._mac(payload)):
            return None
        try:
            worker_id = payload[_TAG:].decode()
        except UnicodeDecodeError:
            return None
        return payload[:_TAG], worker_id

    def holder(self, registry: WorkerRegistry, token: object, param: str) -> tuple[Worker, str]:
        """The worker holding the response `token` names and its own id for it; a RouterError
        (OpenAI's shape) for an id this router did not issue or a holder that is not serving."""
        decoded = self.decode(token)
        if decoded is None:
            shown = token if isinstance(token, str) else orjson.dumps(token).decode()
            raise RouterError(
                400,
                f"Invalid '{param}': '{shown[:200]}' is not a response id issued by this router "
                "(forged, from another deployment, or from a router restarted without "
                "--response-id-key).",
                param=param,
                code="invalid_response_id",
            )
        tag, worker_id = decoded
        assert isinstance(token, str)
        found = [w for w in registry.workers.values() if self.tag(w.url) == tag]
        if not found:
            why = "it was removed from the router"
        elif not found[0].healthy:
            why = f"{found[0].url} is down"
        else:
            return found[0], worker_id
        raise RouterError(
            404,
            f"Response with id '{token}' not found: the worker holding it is not serving ({why}); "
            "its stored responses are gone with it. Start a new chain without "
            "previous_response_id, sending the conversation as input items.",
            param=param,
            code="response_holder_unavailable",
        )


class IdRewriter:
    """One request's worker ids -> router ids, applied to the worker's JSON body or SSE events:
    the ids the request came with (restored for the worker) and the response's own, found in
    the body (top-level id) or the lifecycle events (response.id). SSE events are rewritten
    whole: a chunk is cut at the last event boundary and the rest waits for the next."""

    def __init__(self, ids: ResponseIds, worker_url: str, known: Mapping[str, str]) -> None:
        self.ids = ids
        self.worker_url = worker_url
        self.pairs: dict[bytes, bytes] = {
            _quoted(w): _quoted(t) for w, t in known.items()
        }  # quoted worker id -> quoted router id
        self._pending = b""

    def _learn(self, worker_id: object) -> None:
        if isinstance(worker_id, str) and worker_id.startswith(ID_PREFIX):
            q = _quoted(worker_id)
            if q not in self.pairs:
                self.pairs[q] = _quoted(self.ids.encode(self.worker_url, worker_id))

    def _replace(self, data: bytes) -> bytes:
        for worker_q, router_q in self.pairs.items():
            data = data.replace(worker_q, router_q)
        return data

    def whole(self, body: bytes) -> bytes:
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            return self._replace(body)
        if isinstance(obj, dict) and obj.get("object") == "response":
            self._learn(obj.get("id"))
        return self._replace(body)

    def events(self, chunk: bytes, last: bool = False) -> bytes:
        """The complete events of what came so far, rewritten (at the end, the rest as well)."""
        data = self._pending + chunk
        cut = len(data) if last else data.rfind(b"\n\n") + 2
        if cut < 2 and not last:
            self._pending = data
            return b""
        ready, self._pending = data[:cut], data[cut:]
        if _LIFECYCLE in ready:
            for event in ready.split(b"\n\n"):
                if _LIFECYCLE in event:
                    self._learn(_response_id(event))
        return self._replace(ready)

    @property
    def pending(self) -> bool:
        return bool(self._pending)


class _Body(Protocol):
    async def readany(self) -> bytes: ...

    def is_eof(self) -> bool: ...


class RewrittenStream:
    """A worker's SSE body as copy_stream reads it, with its ids rewritten (IdRewriter)."""

    def __init__(self, inner: _Body, rewriter: IdRewriter) -> None:
        self.inner = inner
        self.rewriter = rewriter

    async def readany(self) -> bytes:
        while True:
            chunk = await self.inner.readany()
            if not chunk:  # the end: what is left of a last event without its blank line
                return self.rewriter.events(b"", last=True)
            out = self.rewriter.events(chunk, last=self.inner.is_eof())
            if out:
                return out

    def is_eof(self) -> bool:
        return self.inner.is_eof() and not self.rewriter.pending


# The request's id context, set by the handler, read by the proxy when the worker answers.
CONTEXT: web.RequestKey[tuple[ResponseIds, dict[str, str]]] = web.RequestKey(
    "smetric_response_ids", tuple
)


def rewriter(request: web.Request, worker_url: str) -> IdRewriter | None:
    """The id rewriter of a Responses request answered by worker_url (None: not one)."""
    context = request.get(CONTEXT)
    if context is None:
        return None
    ids, known = context
    return IdRewriter(ids, worker_url, known)


def restore_previous(
    ids: ResponseIds, registry: WorkerRegistry, request: web.Request, body: dict[str, Any]
) -> Worker | None:
    """Set the request's id context; with previous_response_id, put the holder's own id in the
    body and return the holder (RouterError when there is none: ResponseIds.holder)."""
    known: dict[str, str] = {}
    request[CONTEXT] = (ids, known)
    token = body.get("previous_response_id")
    if token is None:
        return None
    worker, worker_id = ids.holder(registry, token, "previous_response_id")
    body["previous_response_id"] = worker_id
    known[worker_id] = token
    return worker


async def by_id(
    ids: ResponseIds,
    registry: WorkerRegistry,
    session: aiohttp.ClientSession,
    request: web.Request,
    auth: Mapping[str, str],
    timeout: float,
) -> web.Response:
    """GET /v1/responses/{id} and POST /v1/responses/{id}/cancel, relayed to the holder."""
    from smetric_router.router.proxy import REASON_HEADER, WORKER_HEADER  # proxy imports us

    token = request.match_info["response_id"]
    worker, worker_id = ids.holder(registry, token, "response_id")
    tail = "/cancel" if request.path.endswith("/cancel") else ""
    url = f"{worker.url}{PREFIX}/{worker_id}{tail}"
    decision = {WORKER_HEADER: worker.url, REASON_HEADER: HOLDER_REASON}
    try:
        async with session.request(
            request.method,
            url,
            params=request.query,
            headers=auth,
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as resp:
            body = await resp.read()
            status, ctype = resp.status, resp.content_type
    except (aiohttp.ClientError, TimeoutError) as e:
        raise RouterError(
            502,
            f"worker {worker.url} holding response '{token}' did not answer: "
            f"{str(e) or type(e).__name__}",
            type_="server_error",
            code="worker_unavailable",
            headers=decision,
        ) from None
    body = IdRewriter(ids, worker.url, {worker_id: token}).whole(body)
    return web.Response(status=status, body=body, content_type=ctype, headers=decision)


def _quoted(text: str) -> bytes:
    return orjson.dumps(text)


def _response_id(event: bytes) -> object:
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            try:
                obj = orjson.loads(line[5:])
            except orjson.JSONDecodeError:
                return None
            resp = obj.get("response") if isinstance(obj, dict) else None
            return resp.get("id") if isinstance(resp, dict) else None
    return None
