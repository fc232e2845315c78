"""How much room the cluster has for one admission round, from the workers' own state.

Two bounds, both optional:

- the router's cap on requests it has in flight at once (--max-concurrent-requests), which it
  counts exactly;
- each worker's queue (--max-queued-requests-per-worker): requests the worker reports waiting
  (SGLang's /v1/loads num_waiting_reqs, as load minus running in the registry's load rule) plus
  those the router sent it since that report. A worker past it is left to drain; a first turn
  fits while any healthy worker is under it. A worker with no fresh report counts as empty: the
  router's own cap still bounds it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WorkerRoom:
    url: str
    healthy: bool  # passes its health checks and its circuit lets requests through
    queued: float


def queued(load: float, running: int | None) -> float:
    """Requests waiting on a worker: its load (running + waiting, with the router's own
    dispatches since the report) minus its reported running batch; 0 when it reports none."""
    return 0.0 if running is None else max(0.0, load - running)


class RoundRoom:
    """One round's budget: `free` cluster slots, and each worker's queue against max_queued
    (0: not bounded). A worker the round does not know (removed meanwhile) fits: its dispatch
    fails over as usual."""

    def __init__(self, free: int | None, workers: Iterable[WorkerRoom], max_queued: int) -> None:
        self.free = free  # None: no cluster cap
        self.max_queued = max_queued
        self._queued = {w.url: w.queued for w in workers if w.healthy}
        self._known = {w.url for w in workers}

    @property
    def exhausted(self) -> bool:
        """No request fits, whatever its worker: the cluster cap is reached."""
        return self.free is not None and self.free <= 0

    def fits(self, worker: str | None) -> bool:
        if self.exhausted:
            return False
        if not self.max_queued:
            return True
        if worker is None:
            return any(q < self.max_queued for q in self._queued.values())
        if worker not in self._known:
            return True
        q = self._queued.get(worker)
        # an unhealthy holder: admit, and let the dispatch fail over to a healthy worker
        return q is None or q < self.max_queued

    def take(self, worker: str | None) -> None:
        if self.free is not None:
            self.free -= 1
        if not self.max_queued or not self._queued:
            return
        if worker is None:  # the balancer will pick a light one: charge the lightest
            worker = min(self._queued, key=self._queued.__getitem__)
        if worker in self._queued:
            self._queued[worker] += 1
