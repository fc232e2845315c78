"""A sum that halves every `half_life` seconds: recent amounts count fully, old ones fade.

Kept as (value, the time it was last brought up to date), so reading it is O(1) and needs no timer.
Times must not go backwards for one sum (a monotonic clock, or the simulator's event time)."""

from __future__ import annotations

import math
from dataclasses import dataclass

# WorkerView.recent_tokens' half-life. An agent's session comes back after each tool call
# (seconds to minutes) and a coding session lasts minutes to an hour: five minutes keeps the
# sessions still at work and forgets the ones that ended.
RECENT_HALF_LIFE_S = 300.0


@dataclass(slots=True)
class DecayingSum:
    half_life: float
    _value: float = 0.0
    _at: float = 0.0

    def __post_init__(self) -> None:
        if not self.half_life > 0:
            raise ValueError(f"half_life must be > 0, got {self.half_life}")

    def value(self, now: float) -> float:
        if now <= self._at or self._value == 0.0:
            return self._value
        return self._value * math.exp2((self._at - now) / self.half_life)

    def add(self, amount: float, now: float) -> None:
        self._value = self.value(now) + amount
        self._at = max(self._at, now)
