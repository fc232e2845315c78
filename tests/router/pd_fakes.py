"""In-test PD workers: a prefill hands the KV of a bootstrap room to the decode that waits for it.

The pairing follows SGLang's: the decode reads (bootstrap_host, bootstrap_port, bootstrap_room) from
the body and waits for that prefill's transfer of that room; a prefill answers once it has handed
the KV over. Bootstrap ports are fake (nothing listens): the hub stands in for the transfer.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from tests.router.fakes import FakeWorker, free_port

Room = tuple[str, int, int]


class Hub:
    """Stands in for the KV transfer: rooms handed over by prefills, awaited by decodes."""

    def __init__(self) -> None:
        self._rooms: dict[Room, asyncio.Event] = {}

    def room(self, key: Room) -> asyncio.Event:
        return self._rooms.setdefault(key, asyncio.Event())


def _rooms(body: dict[str, Any]) -> list[Room]:
    host, port, room = body["bootstrap_host"], body["bootstrap_port"], body["bootstrap_room"]
    if isinstance(room, list):
        return list(zip(host, port, room, strict=True))
    return [(host, port, room)]


class FakePrefill(FakeWorker):
    def __init__(self, name: str, hub: Hub, *, report_port: bool = True, **kw: Any) -> None:
        super().__init__(name, **kw)
        self.hub = hub
        self.bootstrap_port = free_port()
        self.report_port = report_port  # whether /server_info says disaggregation_bootstrap_port
        self.never_hand_over = False  # accept requests and never transfer their KV
        self.waiting_uncached = 0  # reported as num_waiting_uncached_tokens

    async def _server_info(self, request: web.Request) -> web.Response:
        info: dict[str, Any] = {"page_size": self.page_size, "disaggregation_mode": "prefill"}
        if self.report_port:
            info["disaggregation_bootstrap_port"] = self.bootstrap_port
        return web.json_response(info)

    async def _loads(self, request: web.Request) -> web.Response:
        entry = {"dp_rank": 0, "num_running_reqs": self.running_reqs}
        entry.update(num_waiting_uncached_tokens=self.waiting_uncached, num_used_tokens=0)
        entry["total_prefill_uncached_tokens"] = 10**9  # a cumulative counter: not load
        return web.json_response({"loads": [entry]})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        if self.fail_next > 0:
            self.fail_next -= 1
            return web.json_response({"error": "injected prefill failure"}, status=503)
        if self.stall or self.never_hand_over:
            await self.release.wait()
        if self.never_hand_over:
            return web.json_response({"error": "aborted"}, status=500)
        for key in _rooms(body):
            self.hub.room(key).set()
        return web.json_response(self.reply(request.path))


class FakeDecode(FakeWorker):
    def __init__(self, name: str, hub: Hub, *, kv_timeout: float | None = None, **kw: Any) -> None:
        super().__init__(name, **kw)
        self.hub = hub
        self.kv_timeout = kv_timeout  # None: wait for the KV as long as it takes
        self.used_tokens = 0  # reported as num_used_tokens

    async def _server_info(self, request: web.Request) -> web.Response:
        return web.json_response({"page_size": self.page_size, "disaggregation_mode": "decode"})

    async def _loads(self, request: web.Request) -> web.Response:
        entry = {"dp_rank": 0, "num_running_reqs": 0, "num_used_tokens": self.used_tokens}
        return web.json_response({"loads": [entry]})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()  # read once: the base handler gets the cached body
        if self.fail_next == 0:
            try:
                waits = [self.hub.room(key).wait() for key in _rooms(body)]
                await asyncio.wait_for(asyncio.gather(*waits), self.kv_timeout)
            except TimeoutError:
                self.bodies.append(body)
                msg = "KV transfer from the prefill timed out"
                return web.json_response({"error": {"message": msg}}, status=500)
        return await super()._generate(request)
