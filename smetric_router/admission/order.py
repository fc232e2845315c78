"""The router queue's order, as a pure structure on an injected clock (no tasks, no I/O).

Who goes first when room frees up:

1. first turns that have waited the starvation ceiling or longer, oldest first: without this, a
   steady stream of follow-ups would hold new sessions back for ever;
2. follow-ups (turn > 0), oldest first: their session's KV cache sits on one worker and its
   agent is mid-task, so a wait costs a running session, while a new one has invested nothing;
3. the other first turns, oldest first.

An entry whose worker has no room is passed over, not waited on, so one busy worker does not
hold up requests the rest of the cluster could take.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(slots=True, eq=False)
class Entry:
    """One waiting request. worker: where it must go (a follow-up's holder, or where the policy
    put it); None: anywhere the cluster has room."""

    seq: int
    worker: str | None
    follow_up: bool
    enqueued_at: float


class Room(Protocol):
    """One admission round's budget (admission/room.py)."""

    def fits(self, worker: str | None) -> bool: ...

    def take(self, worker: str | None) -> None: ...


@dataclass(frozen=True, slots=True)
class Pushed:
    """push()'s answer: the new entry (None: the queue was full and it was refused), and the
    first turn it displaced, if any."""

    entry: Entry | None
    displaced: Entry | None = None


class AdmissionQueue:
    def __init__(
        self, max_size: int, timeout_s: float, ceiling_s: float, clock: Callable[[], float]
    ) -> None:
        if max_size < 0:
            raise ValueError(f"max_size must be >= 0, got {max_size}")
        self.max_size = max_size
        self.timeout_s = timeout_s
        self.ceiling_s = ceiling_s
        self.clock = clock
        self._seq = itertools.count()
        # insertion-ordered: arrival order within each class, O(1) removal on cancel
        self._follow_ups: dict[int, Entry] = {}
        self._first_turns: dict[int, Entry] = {}

    def __len__(self) -> int:
        return len(self._follow_ups) + len(self._first_turns)

    def push(self, worker: str | None, follow_up: bool) -> Pushed:
        """Queue a request. A full queue refuses a first turn; a follow-up takes the place of the
        newest first turn not yet starved (it has waited least, and its session has nothing to
        lose yet), and is refused only when there is none."""
        now = self.clock()
        displaced = None
        if len(self) >= self.max_size:
            displaced = self._newest_unstarved(now) if follow_up else None
            if displaced is None:
                return Pushed(None)
            del self._first_turns[displaced.seq]
        entry = Entry(next(self._seq), worker, follow_up, now)
        (self._follow_ups if follow_up else self._first_turns)[entry.seq] = entry
        return Pushed(entry, displaced)

    def remove(self, entry: Entry) -> bool:
        """Take a waiting entry out (its client went away, or it timed out); False when it was
        no longer queued (admitted or removed already)."""
        table = self._follow_ups if entry.follow_up else self._first_turns
        return table.pop(entry.seq, None) is not None

    def expired(self) -> list[Entry]:
        """Remove and return the entries that have waited the timeout or longer."""
        limit = self.clock() - self.timeout_s
        out = [e for e in self._all() if e.enqueued_at <= limit]
        for e in out:
            self.remove(e)
        return out

    def order(self) -> list[Entry]:
        """The waiting entries in admission order (see the module's docstring)."""
        ceiling = self.clock() - self.ceiling_s
        starved = [e for e in self._first_turns.values() if e.enqueued_at <= ceiling]
        rest = [e for e in self._first_turns.values() if e.enqueued_at > ceiling]
        return [*starved, *self._follow_ups.values(), *rest]

    def pick(self, room: Room) -> list[Entry]:
        """Admit, in order, every entry that fits the room; they leave the queue."""
        admitted = []
        for e in self.order():
            if room.fits(e.worker):
                room.take(e.worker)
                self.remove(e)
                admitted.append(e)
        return admitted

    def next_event(self) -> float | None:
        """The earliest time at which an entry times out or a first turn reaches the ceiling
        (None: nothing waits), for the caller's timer."""
        times = [e.enqueued_at + self.timeout_s for e in self._all()]
        times += [e.enqueued_at + self.ceiling_s for e in self._first_turns.values()]
        return min(times, default=None)

    def _all(self) -> list[Entry]:
        return [*self._follow_ups.values(), *self._first_turns.values()]

    def _newest_unstarved(self, now: float) -> Entry | None:
        for e in reversed(self._first_turns.values()):
            return e if now - e.enqueued_at < self.ceiling_s else None
        return None
