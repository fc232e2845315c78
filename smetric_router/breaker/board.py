"""The circuits of all workers, by URL. A worker gets its circuit on first use, so workers added
at run time (POST /workers, discovery) need no hook."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from smetric_router.breaker.metrics import BreakerMetrics
from smetric_router.breaker.state import Breaker, BreakerConfig, Outcome, Pass, State

log = logging.getLogger(__name__)

# What an untracked request (sent past a full half-open circuit, as it had nowhere else to go)
# records against: no circuit, so its outcome is dropped.
UNTRACKED = Pass(-1, False)


class Breakers:
    def __init__(
        self,
        config: BreakerConfig,
        metrics: BreakerMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._metrics = metrics
        self._clock = clock
        self._circuits: dict[str, Breaker] = {}

    def circuit(self, worker: str) -> Breaker:
        b = self._circuits.get(worker)
        if b is None:
            b = Breaker(self.config, self._clock, lambda to: self._moved(worker, to))
            self._circuits[worker] = b
            if self._metrics is not None:
                self._metrics.added(worker)
        return b

    def available(self, worker: str) -> bool:
        b = self._circuits.get(worker)
        return b is None or b.available()

    def state(self, worker: str) -> State:
        b = self._circuits.get(worker)
        return State.CLOSED if b is None else b.state

    def begin(self, worker: str) -> Pass | None:
        return self.circuit(worker).begin()

    def record(self, worker: str, passed: Pass, outcome: Outcome) -> None:
        b = self._circuits.get(worker)
        if b is not None and passed is not UNTRACKED:
            b.record(passed, outcome)

    def describe(self, worker: str) -> dict[str, object]:
        return self.circuit(worker).describe()

    def remove(self, worker: str) -> None:
        """A worker that comes back under the same URL starts closed."""
        if self._circuits.pop(worker, None) is not None and self._metrics is not None:
            self._metrics.removed(worker)

    def _moved(self, worker: str, to: State) -> None:
        if to is State.OPEN:
            log.warning("worker %s: circuit open for %gs", worker, self.config.open_s)
        else:
            log.info("worker %s: circuit %s", worker, to.label)
        if self._metrics is not None:
            self._metrics.moved(worker, to)
