"""When a refused client should come back: Retry-After from the pace at which the queue admits.

A fixed Retry-After (the queue timeout) sends every refused client back after the same pause.
Under sustained overload they return to a queue as full as they left it and are refused again;
a client that gives up after a few refusals (the OpenAI SDK retries twice) has then spent its
retries within seconds, and when the overload ends (a burst's lull) nobody is left to use the
room. So a refused request is told the time its tenant needs to admit what waits ahead of it in
its class, at the pace the router has admitted that tenant's requests of that class lately:

    retry_after = ceil((ahead + 1) / rate)      between 1 and 60 s

ahead: the tenant's requests of the same class (follow-up or first turn) in the queue when it is
refused; rate: that tenant's admissions of that class per second, an exponentially weighted
average over WINDOW_S. Per tenant and class because that is the order the queue admits in
(admission/order.py): a tenant under its share waits for its own few entries and is told a
short pause, a tenant bursting sub-agents a long one, and a refused first turn is told how fast
first turns get in, not how fast the running sessions' follow-ups do. A tenant's pace is at least
its weighted share of its class's pace over the tenants admitted lately: one that sent nothing
for a while has a decayed rate of its own, yet the queue would admit it at its share. Before any
admission of its kind, the caller's fallback (the queue timeout).

Invariants: a pure structure on an injected clock; one entry per (tenant, class) admitted, so
the table is bounded by the tenants the router knows; retry_after() is always in [1, 60].
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

WINDOW_S = 10.0  # several requests' lengths: the recent pace, not a bunching's
MIN_S = 1
MAX_S = 60  # what clients honour: the OpenAI SDK ignores a longer Retry-After
_ACTIVE = 1e-3  # admissions per second below which a tenant no longer shares its class's pace


@dataclass(slots=True)
class _Rate:
    since: float  # the first admission: corrects the average while it is younger than the window
    at: float
    value: float = 0.0  # admissions per second, decayed to `at`


class Pace:
    def __init__(
        self,
        clock: Callable[[], float],
        window_s: float = WINDOW_S,
        weights: Mapping[str, float] | None = None,
    ) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self._clock = clock
        self._window_s = window_s
        self._weights = dict(weights or {})  # tenant -> weight; absent: 1
        self._rates: dict[tuple[str, bool], _Rate] = {}

    def admitted(self, tenant: str, follow_up: bool) -> None:
        now = self._clock()
        r = self._rates.get((tenant, follow_up))
        if r is None:
            r = self._rates[(tenant, follow_up)] = _Rate(since=now, at=now)
        r.value = self._decayed(r, now) + 1.0 / self._window_s
        r.at = now

    def rate(self, tenant: str, follow_up: bool) -> float:
        """Admissions per second of this tenant and class lately (0: none yet)."""
        r = self._rates.get((tenant, follow_up))
        return 0.0 if r is None else self._rate(r, self._clock())

    def pace(self, tenant: str, follow_up: bool) -> float:
        """The rate this tenant's requests of this class can expect to be admitted at: its own
        lately, or its weighted share of the class's, whichever is higher (0: none known)."""
        now = self._clock()
        own = total = 0.0
        weights = self._weight(tenant)
        for (t, f), r in self._rates.items():
            if f != follow_up:
                continue
            rate = self._rate(r, now)
            total += rate
            if t == tenant:
                own = rate
            elif rate >= _ACTIVE:
                weights += self._weight(t)
        return max(own, total * self._weight(tenant) / weights)

    def retry_after(self, tenant: str, follow_up: bool, ahead: int, fallback: int) -> int:
        """Whole seconds a refused request of this tenant and class is told to wait, with
        `ahead` requests of its kind still queued; `fallback` before any pace is known."""
        rate = self.pace(tenant, follow_up)
        wait = fallback if rate <= 0 else math.ceil((ahead + 1) / rate)
        return max(MIN_S, min(MAX_S, wait))

    def _weight(self, tenant: str) -> float:
        return self._weights.get(tenant, 1.0)

    def _rate(self, r: _Rate, now: float) -> float:
        # an average that began `age` ago has seen only part of its window: scale it up as the
        # window it has (1 - exp(-age / window)), so the first seconds are not read as a crawl
        age = max(now - r.since, 1e-9)
        return self._decayed(r, now) / -math.expm1(-age / self._window_s)

    def _decayed(self, r: _Rate, now: float) -> float:
        return r.value * math.exp(-max(0.0, now - r.at) / self._window_s)
