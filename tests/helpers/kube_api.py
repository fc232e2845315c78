"""A stand-in for the Kubernetes API server's pod list and watch, for tests.

It is not a kube-apiserver (none can run here): it is built from the API's documented semantics
(the API concepts page: "Efficient detection of changes", "Watch bookmarks", "410 Gone
responses") and covers what pod discovery uses:

- GET /api/v1/namespaces/{ns}/pods and GET /api/v1/pods, with an equality labelSelector
  (`k=v`, `k==v`, `k!=v`, `k`, `!k`, comma-separated): a PodList whose metadata carries the
  list's resourceVersion;
- the same paths with `?watch=1&resourceVersion=RV[&allowWatchBookmarks=true]
  [&timeoutSeconds=N]`: newline-delimited JSON watch events after RV (ADDED, MODIFIED, DELETED,
  BOOKMARK), then live ones; under a label selector an object that stops matching arrives as
  DELETED and one that starts matching as ADDED, as the API's watch cache sends them;
- an RV older than the kept history: HTTP 200 and one ERROR event holding a 410 Status (what the
  API sends for "too old resource version"), then the end of the stream;
- a bearer token, checked when given (401 otherwise).

Tests drive it: `set_pod`/`delete_pod` change pods, `drop_watches` cuts open watches mid-stream
(the connection closes without the chunked body's end), `compact` forgets the history so that a
watch from before it gets 410, `gone_now` sends 410 on open watches. `requests` records each
call's query for assertions on what the client asked.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml
from aiohttp import web

from smetric_router.core.port_file import bound_port

TOKEN = "stand-in-token"
Pod = dict[str, Any]


def make_pod(
    ns: str,
    name: str,
    labels: Mapping[str, str],
    ip: str | None = None,
    phase: str = "Running",
    ready: bool = True,
    annotations: Mapping[str, str] | None = None,
) -> Pod:
    """A pod object as the API returns it (the fields discovery reads, and a few more)."""
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "True" if ready else "False"},
        ],
    }
    if ip is not None:
        status["podIP"] = ip
        status["podIPs"] = [{"ip": ip}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{ns}-{name}",
            "labels": dict(labels),
            "annotations": dict(annotations or {}),
        },
        "spec": {"containers": [{"name": "sglang", "image": "sglang"}]},
        "status": status,
    }


def _selector(text: str) -> list[tuple[str, str, str | None]]:
    out: list[tuple[str, str, str | None]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        for op in ("==", "!=", "="):
            if op in part:
                key, value = part.split(op, 1)
                out.append((key.strip(), "!=" if op == "!=" else "=", value.strip()))
                break
        else:
            out.append((part[1:], "absent", None) if part.startswith("!") else (part, "has", None))
    return out


def _matches(pod: Pod, ns: str | None, selector: list[tuple[str, str, str | None]]) -> bool:
    meta = pod["metadata"]
    if ns is not None and meta["namespace"] != ns:
        return False
    labels: dict[str, str] = meta.get("labels") or {}
    for key, op, value in selector:
        if (
            (op == "=" and labels.get(key) != value)
            or (op == "!=" and labels.get(key) == value)
            or (op == "has" and key not in labels)
            or (op == "absent" and key in labels)
        ):
            return False
    return True


@dataclass(eq=False)
class _Watch:
    ns: str | None
    selector: list[tuple[str, str, str | None]]
    queue: asyncio.Queue[tuple[str, Pod | None, Pod | None]] = field(default_factory=asyncio.Queue)


@dataclass
class _Change:
    rv: int
    kind: str  # ADDED, MODIFIED, DELETED
    old: Pod | None
    new: Pod


class KubeApiStandIn:
    def __init__(self, bookmark_interval: float = 0.5) -> None:
        self.bookmark_interval = bookmark_interval
        self.pods: dict[tuple[str, str], Pod] = {}
        self.rv = 1000
        self.oldest = 0  # a watch from below this is answered 410
        self.history: list[_Change] = []
        self.watches: set[_Watch] = set()
        self.requests: list[dict[str, str]] = []
        self.unauthorized = 0
        self._runner: web.AppRunner | None = None
        self.port = 0

    # server -----------------------------------------------------------------------------------

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/api/v1/pods", self._pods)
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self._pods)
        self._runner = web.AppRunner(app, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = bound_port(self._runner)
        return self.url

    async def stop(self) -> None:
        self.drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "stand-in", "cluster": {"server": self.url}}],
            "users": [{"name": "router", "user": {"token": TOKEN}}],
            "contexts": [
                {
                    "name": "stand-in",
                    "context": {"cluster": "stand-in", "user": "router", "namespace": namespace},
                }
            ],
            "current-context": "stand-in",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    # what tests do ----------------------------------------------------------------------------

    def set_pod(self, ns: str, name: str, labels: Mapping[str, str], **kw: Any) -> Pod:
        """Create the pod or replace its state (make_pod's keywords)."""
        old = self.pods.get((ns, name))
        pod = make_pod(ns, name, labels, **kw)
        self._record("MODIFIED" if old else "ADDED", old, pod)
        return pod

    def delete_pod(self, ns: str, name: str) -> None:
        old = self.pods[(ns, name)]
        self._record("DELETED", old, old)

    def drop_watches(self) -> None:
        """Cut every open watch mid-stream."""
        for w in self.watches:
            w.queue.put_nowait(("DROP", None, None))
        self.watches.clear()

    def compact(self) -> None:
        """Forget the history: watches from any resourceVersion seen so far get 410."""
        self.history.clear()
        self.oldest = self.rv

    def gone_now(self) -> None:
        """Send an ERROR 410 on every open watch (the API does when its cache falls behind)."""
        self.compact()
        for w in self.watches:
            w.queue.put_nowait(("GONE", None, None))
        self.watches.clear()

    def watch_requests(self) -> list[dict[str, str]]:
        return [q for q in self.requests if q.get("watch") in ("1", "true", "True")]

    # internals --------------------------------------------------------------------------------

    def _record(self, kind: str, old: Pod | None, new: Pod) -> None:
        self.rv += 1
        new = orjson.loads(orjson.dumps(new))
        new["metadata"]["resourceVersion"] = str(self.rv)
        key = (new["metadata"]["namespace"], new["metadata"]["name"])
        if kind == "DELETED":
            self.pods.pop(key, None)
        else:
            self.pods[key] = new
        self.history.append(_Change(self.rv, kind, old, new))
        for w in self.watches:
            w.queue.put_nowait((kind, old, new))

    @staticmethod
    def _seen_as(w: _Watch, kind: str, old: Pod | None, new: Pod) -> str | None:
        """The event type this watcher gets, None for none (selector semantics)."""
        was = old is not None and _matches(old, w.ns, w.selector)
        now = _matches(new, w.ns, w.selector)
        if kind == "DELETED":
            return "DELETED" if was else None
        if was and now:
            return "MODIFIED"
        if now:
            return "ADDED"
        return "DELETED" if was else None

    async def _pods(self, request: web.Request) -> web.StreamResponse:
        q = dict(request.query)
        self.requests.append({**q, "path": request.path})
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.unauthorized += 1
            return self._status(401, "Unauthorized", "Unauthorized")
        ns = request.match_info.get("ns")
        selector = _selector(q.get("labelSelector", ""))
        if q.get("watch") not in ("1", "true", "True"):
            items = [p for p in self.pods.values() if _matches(p, ns, selector)]
            body = {
                "apiVersion": "v1",
                "kind": "PodList",
                "metadata": {"resourceVersion": str(self.rv)},
                "items": items,
            }
            return web.Response(body=orjson.dumps(body), content_type="application/json")
        return await self._watch(request, ns, selector, q)

    @staticmethod
    def _status(code: int, reason: str, message: str) -> web.Response:
        body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                "reason": reason, "code": code}  # fmt: skip
        return web.Response(status=code, body=orjson.dumps(body), content_type="application/json")

    async def _watch(
        self,
        request: web.Request,
        ns: str | None,
        selector: list[tuple[str, str, str | None]],
        q: dict[str, str],
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)

        async def send(kind: str, obj: Mapping[str, Any]) -> None:
            await resp.write(orjson.dumps({"type": kind, "object": obj}) + b"\n")

        since = int(q.get("resourceVersion") or 0)
        if since and since < self.oldest:
            gone = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired",
                    "message": f"too old resource version: {since} ({self.oldest})",
                    "code": 410}  # fmt: skip
            await send("ERROR", gone)
            await resp.write_eof()
            return resp
        w = _Watch(ns, selector)
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1", "True")
        end = asyncio.get_running_loop().time() + float(q.get("timeoutSeconds") or 1800)
        self.watches.add(w)
        try:
            for c in [c for c in self.history if c.rv > since]:
                replayed = self._seen_as(w, c.kind, c.old, c.new)
                if replayed is not None:
                    await send(replayed, c.new)
            while True:
                left = end - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                try:
                    kind, old, new = await asyncio.wait_for(
                        w.queue.get(), min(left, self.bookmark_interval)
                    )
                except asyncio.TimeoutError:
                    if bookmarks:
                        mark = {"kind": "Pod", "apiVersion": "v1",
                                "metadata": {"resourceVersion": str(self.rv)}}  # fmt: skip
                        await send("BOOKMARK", mark)
                    continue
                if kind == "DROP":
                    if request.transport is not None:
                        request.transport.abort()
                    return resp
                if kind == "GONE":
                    gone = {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "reason": "Expired", "message": "too old resource version",
                            "code": 410}  # fmt: skip
                    await send("ERROR", gone)
                    break
                assert new is not None
                seen = self._seen_as(w, kind, old, new)
                if seen is not None:
                    await send(seen, new)
        finally:
            self.watches.discard(w)
        with contextlib.suppress(ConnectionError):
            await resp.write_eof()
        return resp
