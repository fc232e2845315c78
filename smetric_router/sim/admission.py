"""The router's admission in the simulator: its cluster cap (--max-concurrent-requests) and its
queue's order, the router's own AdmissionQueue (admission/order.py) on the virtual clock.

What the router does and this keeps: at most `cap` requests in flight over all instances; a
request that finds the cap reached, or others already waiting, waits at the router; each time
requests end, the queue admits in its order into the slots they freed (first turns that waited
the ceiling, then follow-ups, then the other first turns, each oldest first), and an admitted
request is decided then, on the cluster as it is then. Its TTFT counts from when its client sent
it.

With a grace (SimConfig.queue_session_grace_s, the router's --queue-session-grace-secs) the
slot a request frees is kept for the request continuing its conversation, the router's own
KeptSlots (admission/slots.py) keyed the same way: the ended prompt's last full page hash, claimed
by a follow-up whose prompt holds that page when it arrives.

With a timeout (SimConfig.queue_timeout_s, the router's --queue-timeout-secs) a request that
has waited that long is refused, as the router answers 429 then: it is never placed, and its
conversation goes on as its client would (Cluster: with follow-ups sent on the reply, the next
turn is sent at once, as bench_serving's multi-turn client moves on after a failed turn).

What it leaves out, named so no result leans on it: the queue's size bound, the per-worker bound
(--max-queued-requests-per-worker), tenants and priorities. With the cap alone a queued
request's worker does not decide whether it fits, so it is decided once, at admission, where
the router decides at arrival and again at admission.
"""

from __future__ import annotations

import math
import sys

from smetric_router.admission.order import AdmissionQueue, Entry
from smetric_router.admission.room import RoundRoom
from smetric_router.admission.slots import KeptSlots


class RouterGate:
    """The cap and the waiting requests (trace index, page hashes, arrival time)."""

    def __init__(
        self, cap: int, ceiling_s: float, grace_s: float = 0.0, timeout_s: float = math.inf
    ) -> None:
        if cap < 1:
            raise ValueError(f"cap must be >= 1, got {cap}")
        self.cap = cap
        self.now = 0.0
        self.timeout_s = timeout_s
        self.queue = AdmissionQueue(sys.maxsize, timeout_s, ceiling_s, lambda: self.now)
        # waiting requests in arrival order: seq -> (entry, trace index, page hashes, arrival)
        self._held: dict[int, tuple[Entry, int, list[int], float]] = {}
        self.kept = KeptSlots(grace_s, lambda: self.now) if grace_s > 0 else None
        self.claims = 0

    def keep(self, t: float, key: int | None) -> None:
        """Keep an ended request's slot under its prompt's last full page; without a grace, or
        for a prompt shorter than a page, the slot is free."""
        if self.kept is None or key is None:
            return
        self.now = t
        self.kept.keep(key)

    def kept_slots(self) -> int:
        return 0 if self.kept is None else len(self.kept)

    def claim(self, t: float, pages: list[int]) -> bool:
        """An arriving follow-up takes a slot kept under one of its prompt's pages."""
        if self.kept is None:
            return False
        self.now = t
        if self.kept.claim(reversed(pages)):
            self.claims += 1
            return True
        return False

    def expire(self, t: float) -> None:
        """Kept slots whose grace ended by t go back to the queue."""
        if self.kept is None:
            return
        self.now = t
        self.kept.expire()

    def next_expiry(self) -> float | None:
        return None if self.kept is None else self.kept.next_expiry()

    def wait(self, t: float, index: int, hashes: list[int], follow_up: bool) -> None:
        self.now = t
        entry = self.queue.push(None, follow_up).entry
        if entry is None:  # cannot happen: the queue has no size bound
            raise RuntimeError("the router queue refused a request")
        self._held[entry.seq] = (entry, index, hashes, t)

    def admit(self, t: float, free: int) -> list[tuple[int, list[int], float]]:
        """What the queue admits at t into `free` slots, in its order."""
        self.now = t
        return [self._held.pop(e.seq)[1:] for e in self.queue.pick(RoundRoom(free, (), 0))]

    def next_timeout(self) -> float | None:
        """When the oldest waiting request times out (None: nothing waits, or no timeout).
        Requests wait in arrival order (_held keeps it), so the oldest is the first held."""
        if math.isinf(self.timeout_s) or not self._held:
            return None
        return next(iter(self._held.values()))[3] + self.timeout_s

    def refuse(self, t: float) -> list[tuple[int, list[int], float]]:
        """Take out the requests that have waited the timeout by t, oldest first."""
        self.now = t
        out = []
        # the same sum next_timeout() gave, so the request due at t is refused at t (the
        # queue's own expired() compares with t - timeout, which rounding can miss)
        while self._held:
            entry, index, hashes, at = next(iter(self._held.values()))
            if at + self.timeout_s > t:
                break
            self.queue.remove(entry)
            del self._held[entry.seq]
            out.append((index, hashes, at))
        return out
