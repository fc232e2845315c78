"""One worker's circuit: a pure state machine on an injected clock.

closed: requests flow; it opens after `failure_threshold` failures in a row, or (when
`failure_ratio` is set) once failures reach that share of the outcomes in the last `window_s`,
counted only from `min_requests` outcomes on, so one failure of two does not open it.
open: no request is sent there until `open_s` has passed; then half-open.
half-open: at most `half_open_max` requests at once go there as probes; `success_threshold`
successes in a row close it, one failure opens it again for another `open_s`.

Outcomes of requests begun before the last transition are dropped: a slow request sent while the
circuit was closed says nothing about the worker a probe is testing now.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, IntEnum


class State(IntEnum):
    # the values are smetric_breaker_state's
    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")


class Outcome(Enum):
    SUCCESS = "success"
    FAILURE = "failure"
    IGNORED = "ignored"  # says nothing about the worker: a 4xx, a client gone, a router shortage


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    failure_threshold: int = 10
    success_threshold: int = 3
    open_s: float = 60.0
    window_s: float = 120.0
    failure_ratio: float = 0.0  # 0: the ratio rule is off
    min_requests: int = 20
    half_open_max: int = 1

    def __post_init__(self) -> None:
        if self.failure_threshold < 1 or self.success_threshold < 1 or self.half_open_max < 1:
            raise ValueError("breaker thresholds and the half-open probe limit must be >= 1")
        if self.open_s <= 0 or self.window_s <= 0:
            raise ValueError("breaker cool-down and window must be > 0 seconds")
        if not 0 <= self.failure_ratio <= 1:
            raise ValueError(f"breaker failure ratio must be in [0, 1], got {self.failure_ratio}")
        if self.min_requests < 1:
            raise ValueError(f"breaker minimum requests must be >= 1, got {self.min_requests}")


@dataclass(frozen=True, slots=True)
class Pass:
    """A request let through: hand it back to record() with its outcome."""

    generation: int
    probe: bool


# The ratio window is kept in this many buckets: memory stays bounded at any request rate, and
# the window slides in steps of a twentieth of its length.
_BUCKETS = 20


class Breaker:
    def __init__(
        self,
        config: BreakerConfig,
        clock: Callable[[], float],
        on_change: Callable[[State], None] | None = None,
    ) -> None:
        self.config = config
        self._clock = clock
        self._on_change = on_change
        self._state = State.CLOSED
        self._generation = 0
        self._opened_at = 0.0
        self._failures = 0  # in a row (closed)
        self._successes = 0  # in a row (half-open)
        self._probes = 0  # in flight (half-open)
        self._buckets: deque[list[float]] = deque()  # [start, outcomes, failures]

    @property
    def state(self) -> State:
        """The state now; an open circuit whose cool-down has passed turns half-open here, so no
        timer is needed."""
        if self._state is State.OPEN and self._clock() >= self._opened_at + self.config.open_s:
            self._move(State.HALF_OPEN)
        return self._state

    @property
    def retry_at(self) -> float | None:
        """When an open circuit turns half-open (the clock's time); None unless open."""
        return self._opened_at + self.config.open_s if self.state is State.OPEN else None

    def available(self) -> bool:
        """Whether a request may be sent there now."""
        state = self.state
        return state is State.CLOSED or (
            state is State.HALF_OPEN and self._probes < self.config.half_open_max
        )

    def begin(self) -> Pass | None:
        """Let one request through (None: not now). A half-open circuit counts it as a probe."""
        if not self.available():
            return None
        probe = self._state is State.HALF_OPEN
        if probe:
            self._probes += 1
        return Pass(self._generation, probe)

    def record(self, passed: Pass, outcome: Outcome) -> None:
        if passed.generation != self._generation:
            return
        if passed.probe:
            self._probes -= 1
        if outcome is Outcome.IGNORED:
            return
        failed = outcome is Outcome.FAILURE
        if self._state is State.HALF_OPEN:
            if failed:
                self._open()
            else:
                self._successes += 1
                if self._successes >= self.config.success_threshold:
                    self._move(State.CLOSED)
            return
        self._failures = self._failures + 1 if failed else 0
        if self._failures >= self.config.failure_threshold or self._ratio_exceeded(failed):
            self._open()

    def describe(self) -> dict[str, object]:
        state = self.state
        out: dict[str, object] = {"state": state.label, "consecutive_failures": self._failures}
        if state is State.OPEN:
            out["retry_in_s"] = round(
                max(0.0, self._opened_at + self.config.open_s - self._clock()), 3
            )
        if state is State.HALF_OPEN:
            out["probes_in_flight"] = self._probes
            out["probe_successes"] = self._successes
        return out

    # internals -------------------------------------------------------------------------------

    def _ratio_exceeded(self, failed: bool) -> bool:
        c = self.config
        if not c.failure_ratio:
            return False
        now = self._clock()
        width = c.window_s / _BUCKETS
        while self._buckets and self._buckets[0][0] <= now - c.window_s:
            self._buckets.popleft()
        if not self._buckets or self._buckets[-1][0] + width <= now:
            self._buckets.append([now, 0.0, 0.0])
        last = self._buckets[-1]
        last[1] += 1
        last[2] += failed
        total = sum(b[1] for b in self._buckets)
        failures = sum(b[2] for b in self._buckets)
        return total >= c.min_requests and failures >= c.failure_ratio * total

    def _open(self) -> None:
        self._opened_at = self._clock()
        self._move(State.OPEN)

    def _move(self, to: State) -> None:
        self._state = to
        self._generation += 1
        self._failures = self._successes = self._probes = 0
        self._buckets.clear()
        if self._on_change is not None:
            self._on_change(to)


class Verdict:
    """What one attempt says about its worker, filled in as the attempt goes; an attempt that
    ends before it says anything (cancelled, refused by the router itself) is IGNORED."""

    __slots__ = ("outcome",)

    def __init__(self) -> None:
        self.outcome = Outcome.IGNORED

    def failed(self) -> None:
        self.outcome = Outcome.FAILURE

    def answered(self, status: int) -> None:
        """The worker's whole answer came: a 5xx is its failure, a 4xx the client's."""
        if status >= 500:
            self.outcome = Outcome.FAILURE
        elif status < 400:
            self.outcome = Outcome.SUCCESS
