"""Fault injection for the router's failure tests (POST /emulator/faults). No fault is armed until a
test arms one; faults apply to the generation endpoints only, so health probes keep answering
(probe_delay_secs delays the prefix-match probe only).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Faults:
    fail_next: int = 0  # refuse this many requests with `status` before the first byte
    status: int = 503
    die_mid_stream_next: int = 0  # drop the connection after the first chunk of this many
    stall: bool = False  # accept requests and answer none until stall is cleared
    withhold_kv_next: int = 0  # PD prefill: this many requests never hand their KV over
    probe_delay_secs: float = 0.0  # /smetric/prefix_match answers only after this long
    _unstalled: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._unstalled.set()

    def update(self, body: dict[str, Any]) -> None:
        """Set the faults named in body; raises ValueError (nothing changed) on a bad value."""
        known = {
            "fail_next",
            "status",
            "die_mid_stream_next",
            "stall",
            "withhold_kv_next",
            "probe_delay_secs",
        }
        unknown = set(body) - known
        if unknown:
            raise ValueError(f"unknown fault(s): {sorted(unknown)}")
        for key in ("fail_next", "die_mid_stream_next", "withhold_kv_next"):
            if key in body and (type(body[key]) is not int or body[key] < 0):
                raise ValueError(f"{key} must be a non-negative integer")
        if "status" in body and (
            type(body["status"]) is not int or not 400 <= body["status"] < 600
        ):
            raise ValueError("status must be an HTTP error status (400-599)")
        if "stall" in body and type(body["stall"]) is not bool:
            raise ValueError("stall must be a boolean")
        delay = body.get("probe_delay_secs", 0.0)
        if type(delay) not in (int, float) or not 0 <= delay < float("inf"):
            raise ValueError("probe_delay_secs must be a non-negative number of seconds")
        self.fail_next = body.get("fail_next", self.fail_next)
        self.status = body.get("status", self.status)
        self.die_mid_stream_next = body.get("die_mid_stream_next", self.die_mid_stream_next)
        self.stall = body.get("stall", self.stall)
        self.withhold_kv_next = body.get("withhold_kv_next", self.withhold_kv_next)
        self.probe_delay_secs = float(body.get("probe_delay_secs", self.probe_delay_secs))
        if self.stall:
            self._unstalled.clear()
        else:
            self._unstalled.set()

    def state(self) -> dict[str, Any]:
        return {
            "fail_next": self.fail_next,
            "status": self.status,
            "die_mid_stream_next": self.die_mid_stream_next,
            "stall": self.stall,
            "withhold_kv_next": self.withhold_kv_next,
            "probe_delay_secs": self.probe_delay_secs,
        }

    def take_fail(self) -> int | None:
        """The status to refuse this request with, or None."""
        if self.fail_next == 0:
            return None
        self.fail_next -= 1
        return self.status

    def take_die(self) -> bool:
        if self.die_mid_stream_next == 0:
            return False
        self.die_mid_stream_next -= 1
        return True

    def take_withhold(self) -> bool:
        if self.withhold_kv_next == 0:
            return False
        self.withhold_kv_next -= 1
        return True

    async def wait_unstalled(self) -> None:
        await self._unstalled.wait()
