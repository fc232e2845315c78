"""The asynchronous side of admission: waiters, their futures and the timer that re-checks the
queue. The order itself is admission/order.py's; the room admission/room.py's."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from smetric_router.admission.metrics import (
    CANCELLED,
    DISPLACED,
    QUEUE_FULL,
    TIMEOUT,
    AdmissionMetrics,
    kind,
)
from smetric_router.admission.order import ANONYMOUS, AdmissionQueue, Entry
from smetric_router.admission.pace import Pace
from smetric_router.admission.room import RoundRoom, WorkerRoom
from smetric_router.admission.slots import KeptSlots
from smetric_router.admission.usage import SlotUse

# How often a non-empty queue is re-checked against the workers' reports: a worker's room
# changes with its load polls, which wake nobody.
RECHECK_S = 0.05


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    max_concurrent: int | None  # None: no cluster cap (the queue waits on workers' room alone)
    queue_size: int
    timeout_s: float
    ceiling_s: float  # a first turn's wait after which it goes before follow-ups
    max_queued_per_worker: int  # 0: workers' queues not checked
    # with the cap: how long the slot a request frees is kept for the request continuing its
    # conversation (admission/slots.py); 0: not kept
    session_grace_s: float = 0.0

    @property
    def retry_after(self) -> int:
        """Seconds a refused client is told to wait before the queue's pace is known
        (admission/pace.py): the queue's timeout, as a request that waited that long found no
        room (1 to 60)."""
        return max(1, min(60, math.ceil(self.timeout_s)))


class Shed(Exception):
    """The request leaves unadmitted (HTTP 429); retry_after: the seconds its client is told to
    wait (admission/pace.py)."""

    def __init__(self, reason: str, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after = retry_after


class Ticket:
    """An admitted request's slot; release() exactly once when it ends (extra calls are no-ops)."""

    __slots__ = ("_gate", "_released", "order", "tenant", "waited_s")

    def __init__(self, gate: Gate, order: int, waited_s: float, tenant: str) -> None:
        self._gate = gate
        self._released = False
        self.order = order  # the nth admission of this router
        self.waited_s = waited_s
        self.tenant = tenant

    def release(self, keep: int | None = None) -> None:
        """keep: the last full page hash of the request's prompt, under which its slot is kept
        for the follow-up that continues it, where the gate keeps slots (admission/slots.py)."""
        if not self._released:
            self._released = True
            self._gate._release(self.tenant, keep)


class Gate:
    def __init__(
        self,
        config: AdmissionConfig,
        workers: Callable[[], Iterable[WorkerRoom]],
        metrics: Callable[[Gate], AdmissionMetrics],
        clock: Callable[[], float] = time.monotonic,
        weights: Mapping[str, float] | None = None,
    ) -> None:
        self.config = config
        self.running = 0
        self._use = SlotUse(clock)  # each tenant's slots, for its share in the queue's order
        self._pace = Pace(clock, weights=weights)  # admissions per tenant and class
        self._workers = workers
        self._clock = clock
        self._queue = AdmissionQueue(
            config.queue_size, config.timeout_s, config.ceiling_s, clock, weights
        )
        self._waiters: dict[int, asyncio.Future[int]] = {}
        grace = config.session_grace_s if config.max_concurrent is not None else 0.0
        self._kept = KeptSlots(grace, clock) if grace > 0 else None
        self._admissions = itertools.count(1)
        self._timer: asyncio.Task[None] | None = None
        self.metrics = metrics(self)

    @property
    def queued(self) -> int:
        return len(self._queue)

    def queued_by_tenant(self) -> dict[str, int]:
        return self._queue.counts()

    async def admit(
        self,
        worker: str | None,
        follow_up: bool,
        tenant: str = ANONYMOUS,
        priority: int = 0,
        pages: Sequence[int] = (),
    ) -> Ticket:
        """Wait for room for a request bound to `worker` (None: any); raises Shed when it is
        refused or times out. Cancelling the caller takes its entry out of the queue at once.
        tenant and priority place it in the queue's order (admission/order.py). pages: a
        follow-up's prompt page hashes, with which it takes a slot its conversation's previous
        request left kept (admission/slots.py) before any queue."""
        started = self._clock()
        label = kind(follow_up)
        self._expire_kept()
        # the kept page is the previous prompt's last: from the end, it is found sooner
        if follow_up and self._kept is not None and self._kept.claim(reversed(pages)):
            self.metrics.session_slots.labels("claimed").inc()
            self.running -= 1  # the kept slot passes to this request, which _admitted counts
            return self._admitted(follow_up, tenant)
        if not self._queue:  # nothing waits ahead of it
            room = self._room()
            if room.fits(worker):
                return self._admitted(follow_up, tenant)
        pushed = self._queue.push(worker, follow_up, tenant, priority)
        if pushed.displaced is not None:
            why = (
                "a running session's follow-up took its place"
                if follow_up
                else "a request of a tenant under its share of the queue took its place"
            )
            self._shed(pushed.displaced, DISPLACED, why)
        entry = pushed.entry
        if entry is None:
            self.metrics.shed.labels(QUEUE_FULL, label, tenant).inc()
            raise Shed(
                QUEUE_FULL,
                f"the router queue is full ({self.config.queue_size} waiting)",
                self._retry_after(tenant, follow_up),
            )
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters[entry.seq] = fut
        self._wake()
        if not fut.done():
            self._arm()
        try:
            order = await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self._release(tenant)  # admitted just as its client left: hand the slot on
            elif self._queue.remove(entry):
                self._waiters.pop(entry.seq, None)
                self.metrics.shed.labels(CANCELLED, label, tenant).inc()
            raise
        waited = self._clock() - started
        self.metrics.admitted.labels(label, "yes", tenant).inc()
        self.metrics.wait.labels(label, tenant).observe(waited)
        return Ticket(self, order, waited, tenant)

    def _admitted(self, follow_up: bool, tenant: str) -> Ticket:
        self.running += 1
        self._use.start(tenant)
        self._pace.admitted(tenant, follow_up)
        label = kind(follow_up)
        self.metrics.admitted.labels(label, "no", tenant).inc()
        self.metrics.wait.labels(label, tenant).observe(0.0)
        return Ticket(self, next(self._admissions), 0.0, tenant)

    def _room(self) -> RoundRoom:
        cap = self.config.max_concurrent
        return RoundRoom(
            None if cap is None else cap - self.running,
            self._workers() if self.config.max_queued_per_worker else (),
            self.config.max_queued_per_worker,
        )

    def _release(self, tenant: str, keep: int | None = None) -> None:
        self._use.end(tenant)
        if keep is not None and self._kept is not None:
            self._kept.keep(keep)  # still running: the slot waits for its follow-up
            self.metrics.session_slots.labels("kept").inc()
            return
        self.running -= 1
        if self._queue:
            self._wake()

    def _expire_kept(self) -> None:
        """Kept slots nobody claimed in time go back to the queue."""
        if self._kept is None:
            return
        n = self._kept.expire()
        if n:
            self.running -= n
            self.metrics.session_slots.labels("expired").inc(n)

    def _wake(self) -> None:
        """Shed what timed out, then admit in order what fits."""
        self._expire_kept()
        for e in self._queue.expired():
            waited = self.config.timeout_s
            self._shed(e, TIMEOUT, f"no room within the queue timeout ({waited:g} s)")
        if not self._queue:
            return
        room = self._room()
        if room.exhausted:  # the usual case under a flood: ordering 10K waiters would find none
            return
        for e in self._queue.pick(room, self._use.snapshot()):
            fut = self._waiters.pop(e.seq, None)
            if fut is not None and not fut.done():
                self.running += 1
                self._use.start(e.tenant)
                self._pace.admitted(e.tenant, e.follow_up)
                fut.set_result(next(self._admissions))

    def _shed(self, entry: Entry, reason: str, why: str) -> None:
        self.metrics.shed.labels(reason, kind(entry.follow_up), entry.tenant).inc()
        fut = self._waiters.pop(entry.seq, None)
        if fut is not None and not fut.done():
            fut.set_exception(Shed(reason, why, self._retry_after(entry.tenant, entry.follow_up)))

    def _retry_after(self, tenant: str, follow_up: bool) -> int:
        ahead = self._queue.waiting(tenant, follow_up)
        return self._pace.retry_after(tenant, follow_up, ahead, self.config.retry_after)

    def _arm(self) -> None:
        if self._timer is None or self._timer.done():
            self._timer = asyncio.get_running_loop().create_task(self._recheck())

    def next_pause_s(self) -> float:
        """How long the recheck sleeps: until the queue's next event, RECHECK_S at most. An
        event already past was handled by the wake that followed it; a first turn past its
        ceiling stays the queue's earliest event until it is admitted, and waking at once for
        it again would spin the loop for as long as it waits."""
        due = self._queue.next_event()
        now = self._clock()
        if due is None or due <= now:
            return RECHECK_S
        return min(RECHECK_S, due - now)

    async def _recheck(self) -> None:
        while self._queue:
            await asyncio.sleep(self.next_pause_s())
            self._wake()

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
