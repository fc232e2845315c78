"""Each tenant's use of the router's admission slots, on an injected clock: what the queue's
tenant order (admission/order.py) compares.

A tenant's use is the larger of the requests it runs now and their exponentially weighted
average over the last `window_s` seconds. The count alone moves with every arrival: a tenant
asking for a third of the cluster beside a flood of sub-agents is, by chance, above half of the
slots for a moment, and then waits behind the flood exactly when its own requests bunch up. The
average alone would let a tenant that just arrived take every slot until its average caught up
with the others'. Taking the larger, a tenant goes before another only when it both runs fewer
requests now and has run fewer lately.

Invariants: use(t) >= running(t) >= 0; a tenant absent for many windows decays to 0 and is
dropped, so the table is bounded by the tenants that ran lately.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

WINDOW_S = 10.0  # several requests' lengths: longer than a bunching, shorter than a burst
_FORGET = 1e-3  # an average this small, with nothing running, is dropped


@dataclass(slots=True)
class _Tenant:
    running: int = 0
    average: float = 0.0


class SlotUse:
    def __init__(self, clock: Callable[[], float], window_s: float = WINDOW_S) -> None:
        if window_s < 0:
            raise ValueError(f"window_s must be >= 0, got {window_s}")
        self._clock = clock
        self._window_s = window_s
        self._tenants: dict[str, _Tenant] = {}
        self._at = clock()

    def __len__(self) -> int:
        return len(self._tenants)

    def start(self, tenant: str) -> None:
        self._advance()
        self._tenants.setdefault(tenant, _Tenant()).running += 1

    def end(self, tenant: str) -> None:
        self._advance()
        t = self._tenants.get(tenant)
        if t is None or t.running <= 0:
            raise ValueError(f"tenant {tenant!r} has no running request to end")
        t.running -= 1

    def running(self, tenant: str) -> int:
        t = self._tenants.get(tenant)
        return 0 if t is None else t.running

    def snapshot(self) -> dict[str, float]:
        """Each tenant's use now (absent: none)."""
        self._advance()
        return {name: max(t.running, t.average) for name, t in self._tenants.items()}

    def _advance(self) -> None:
        now = self._clock()
        elapsed = now - self._at
        if elapsed <= 0:
            return
        self._at = now
        keep = 0.0 if self._window_s == 0 else math.exp(-elapsed / self._window_s)
        gone = []
        for name, t in self._tenants.items():
            t.average = t.running + (t.average - t.running) * keep
            if not t.running and t.average < _FORGET:
                gone.append(name)
        for name in gone:
            del self._tenants[name]
