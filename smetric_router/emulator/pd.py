"""The emulated PD KV handover: a prefill instance offers a finished prompt's KV under its bootstrap
room, and the paired decode instance fetches it over the prefill's bootstrap port.

Wire: the prefill serves `GET /emulator/kv/{room}?wait=S` on its bootstrap port. The answer is a
long poll: 200 with the handover as JSON once the room's KV is ready (the room is then consumed),
or 408 after S seconds without it. The decode side polls until its own deadline, retrying refused
connections, so a decode that arrives before its prefill (or a prefill still starting) just waits.
The transfer itself is modelled, not moved: prompt KV bytes over the configured link, slept on the
decode side after the handover.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from smetric_router.engine.api import CachedTokens

ROOM_TTL_S = 600.0  # an offered room no decode came for is dropped after this long
_POLL_S = 5.0  # one long poll's wait; the decode side polls again until its deadline
_RETRY_S = 0.05  # pause after a refused connection to the bootstrap port
_MAX_ROOM = 2**63  # SGLang's rooms: random.randint(0, 2**63 - 1)


class KvTransferError(RuntimeError):
    """The decode side did not get its room's KV (timed out, or the room did not match)."""


@dataclass(frozen=True, slots=True)
class Handover:
    """What the prefill hands the decode side with the KV of one room."""

    room: int
    prompt_tokens: int
    cached: CachedTokens  # the prefill's cache hit, reported by the decode as the request's

    def to_json(self) -> dict[str, object]:
        c = self.cached
        return {
            "room": self.room,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": {"device": c.device, "host": c.host, "storage": c.storage},
        }

    @classmethod
    def from_json(cls, obj: dict[str, object]) -> Handover:
        c = obj["cached_tokens"]
        if not isinstance(c, dict):
            raise ValueError("cached_tokens must be an object")
        room, n = obj["room"], obj["prompt_tokens"]
        if type(room) is not int or type(n) is not int:
            raise ValueError("room and prompt_tokens must be integers")
        return cls(room, n, CachedTokens(int(c["device"]), int(c["host"]), int(c["storage"])))


@dataclass(slots=True)
class _Room:
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    handover: Handover | None = None
    offered_at: float = 0.0
    waiters: int = 0


class Rooms:
    """The prefill side's rooms: offered by finished prefills, taken by decode polls."""

    def __init__(self) -> None:
        self._rooms: dict[int, _Room] = {}

    def __len__(self) -> int:
        return len(self._rooms)

    def offer(self, handover: Handover) -> None:
        now = time.monotonic()
        stale = [
            k
            for k, r in self._rooms.items()
            if r.handover is not None and now - r.offered_at > ROOM_TTL_S
        ]
        for k in stale:
            del self._rooms[k]
        room = self._rooms.setdefault(handover.room, _Room())
        room.handover, room.offered_at = handover, now
        room.ready.set()

    async def take(self, key: int, wait_s: float) -> Handover | None:
        room = self._rooms.setdefault(key, _Room())
        room.waiters += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(room.ready.wait(), wait_s)
        finally:
            room.waiters -= 1
        if room.handover is not None:
            self._rooms.pop(key, None)
        elif room.waiters == 0 and self._rooms.get(key) is room:
            del self._rooms[key]  # nobody offered it: keep no trace of the poll
        return room.handover


ROOMS = web.AppKey("rooms", Rooms)


async def _kv_handler(request: web.Request) -> web.Response:
    try:
        key = int(request.match_info["room"])
        wait_s = min(float(request.query.get("wait", _POLL_S)), _POLL_S)
    except ValueError:
        return web.json_response({"detail": "room and wait must be numbers"}, status=400)
    handover = await request.app[ROOMS].take(key, max(wait_s, 0.0))
    if handover is None:
        return web.json_response({"detail": f"room {key} is not ready"}, status=408)
    return web.json_response(handover.to_json())


def make_bootstrap_app(rooms: Rooms) -> web.Application:
    app = web.Application()
    app[ROOMS] = rooms
    app.router.add_get("/emulator/kv/{room}", _kv_handler)
    return app


def transfer_seconds(prompt_tokens: int, kv_bytes_per_token: int, gbps: float) -> float:
    """Model seconds to move a prompt's KV over a link of `gbps` gigabits per second."""
    return prompt_tokens * kv_bytes_per_token * 8 / (gbps * 1e9)


def parse_room(value: object) -> int:
    if type(value) is not int or not 0 <= value < _MAX_ROOM:
        raise ValueError("bootstrap_room must be an integer in [0, 2**63)")
    return value


async def fetch_kv(
    http: aiohttp.ClientSession, host: str, port: int, room: int, timeout_s: float
) -> Handover:
    """Poll the prefill at host:port for room's KV until timeout_s passes."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    url = f"http://{host}:{port}/emulator/kv/{room}"
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        wait_s = min(left, _POLL_S)
        try:
            timeout = aiohttp.ClientTimeout(total=wait_s + 5.0)
            async with http.get(url, params={"wait": f"{wait_s:.3f}"}, timeout=timeout) as r:
                if r.status == 200:
                    try:
                        return Handover.from_json(await r.json())
                    except (KeyError, ValueError, aiohttp.ContentTypeError) as exc:
                        raise KvTransferError(f"bad handover from {host}:{port}: {exc}") from exc
                if r.status != 408:
                    raise KvTransferError(f"bootstrap server {host}:{port} answered {r.status}")
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError):
            await asyncio.sleep(min(_RETRY_S, max(deadline - time.monotonic(), 0.0)))
    raise KvTransferError(
        f"KV transfer timed out: no KV for bootstrap room {room} from {host}:{port} "
        f"within {timeout_s:g}s"
    )
