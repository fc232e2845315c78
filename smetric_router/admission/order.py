"""The router queue's order, as a pure structure on an injected clock (no tasks, no I/O).

Who goes first when room frees up: first the tenant, then the request.

The tenants (API keys of --api-key-file; one "anonymous" tenant without it) share the router's
admission slots by weight: the next admission goes to the tenant using the fewest slots for its
weight (what the caller passes as `held`: admission/usage.py's running requests, or their recent
average when higher), so a tenant using less than its share waits only for the next slot to
free, however many requests another tenant keeps waiting. Counting admissions instead
(start-time fair queueing alone) gave two backlogged tenants turns in alternation, so a tenant
asking for a third of the cluster beside a flood of sub-agents waited several slot-frees per
request and kept 0.76 of its goodput alone (benchmarks/results/admission.md). Among tenants
using the same share, the one with the least virtual time goes first; each admission advances it
by 1 / weight (a tenant that was idle starts at the current virtual time, so it cannot bank an
idle hour against the others). Tenant before class: a tenant
with many sessions running has many follow-ups, and were they to go before every tenant's new
sessions, a swarm of sub-agents would shut the other tenants out (measured: another tenant kept
0.64 of its goodput alone; benchmarks/results/admission.md). Ties go to the tenant whose next
request is of the earlier class below, then came first, so among equals follow-ups still go
first across tenants.

Within a tenant:

1. first turns that have waited the starvation ceiling or longer: without this, a steady stream
   of follow-ups would hold new sessions back for ever;
2. follow-ups (turn > 0): their session's KV cache sits on one worker and its agent is mid-task,
   so a wait costs a running session, while a new one has invested nothing;
3. the other first turns;

and within each class a higher `priority` first (SGLang's meaning of the field), then the
oldest. With one tenant and no priorities this is arrival order within each class.

An entry whose worker has no room is passed over, not waited on, so one busy worker does not
hold up requests the rest of the cluster could take.

A full queue makes room by displacing a first turn that has not reached the ceiling (its session
has nothing to lose yet), taken from the tenant holding the most places for its weight, its
lowest priority and newest first: for a follow-up always when there is one; for a first turn only
when its own tenant holds fewer places for its weight than that tenant would after the swap.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

ANONYMOUS = "anonymous"  # the tenant of every request when the router has no key file


@dataclass(slots=True, eq=False)
class Entry:
    """One waiting request. worker: where it must go (a follow-up's holder, or where the policy
    put it); None: anywhere the cluster has room."""

    seq: int
    worker: str | None
    follow_up: bool
    enqueued_at: float
    tenant: str = ANONYMOUS
    priority: int = 0


class Room(Protocol):
    """One admission round's budget (admission/room.py)."""

    def fits(self, worker: str | None) -> bool: ...

    def take(self, worker: str | None) -> None: ...


class _Fits:
    """A room where everything fits: order() is pick() without limits."""

    def fits(self, worker: str | None) -> bool:
        return True

    def take(self, worker: str | None) -> None:
        pass


@dataclass(frozen=True, slots=True)
class Pushed:
    """push()'s answer: the new entry (None: the queue was full and it was refused), and the
    first turn it displaced, if any."""

    entry: Entry | None
    displaced: Entry | None = None


@dataclass(slots=True)
class _Waiting:
    """One tenant's waiting entries, insertion-ordered (O(1) removal on cancel)."""

    follow_ups: dict[int, Entry] = field(default_factory=dict)
    first_turns: dict[int, Entry] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.follow_ups) + len(self.first_turns)

    def table(self, entry: Entry) -> dict[int, Entry]:
        return self.follow_ups if entry.follow_up else self.first_turns


def _within(entry: Entry) -> tuple[int, int]:
    """Order inside one tenant's class: higher priority first, then arrival."""
    return (-entry.priority, entry.seq)


class AdmissionQueue:
    def __init__(
        self,
        max_size: int,
        timeout_s: float,
        ceiling_s: float,
        clock: Callable[[], float],
        weights: Mapping[str, float] | None = None,
    ) -> None:
        if max_size < 0:
            raise ValueError(f"max_size must be >= 0, got {max_size}")
        self.max_size = max_size
        self.timeout_s = timeout_s
        self.ceiling_s = ceiling_s
        self.clock = clock
        self._weights = dict(weights or {})  # tenant -> weight; absent: 1
        self._seq = itertools.count()
        self._size = 0
        self._waiting: dict[str, _Waiting] = {}  # tenants with entries waiting
        self._vtime: dict[str, float] = {}  # bounded by the key file's tenants
        self._vnow = 0.0  # the virtual time of the latest admission's start

    def __len__(self) -> int:
        return self._size

    def weight(self, tenant: str) -> float:
        return self._weights.get(tenant, 1.0)

    def counts(self) -> dict[str, int]:
        """Entries waiting per tenant (tenants with none are absent)."""
        return {t: len(w) for t, w in self._waiting.items()}

    def waiting(self, tenant: str, follow_up: bool) -> int:
        """Entries of this tenant and class waiting."""
        w = self._waiting.get(tenant)
        if w is None:
            return 0
        return len(w.follow_ups if follow_up else w.first_turns)

    def push(
        self, worker: str | None, follow_up: bool, tenant: str = ANONYMOUS, priority: int = 0
    ) -> Pushed:
        """Queue a request; a full queue displaces a first turn for it or refuses it (see the
        module's docstring)."""
        now = self.clock()
        displaced = None
        if self._size >= self.max_size:
            displaced = self._victim(now, follow_up, tenant)
            if displaced is None:
                return Pushed(None)
            self.remove(displaced)
        entry = Entry(next(self._seq), worker, follow_up, now, tenant, priority)
        waiting = self._waiting.get(tenant)
        if waiting is None:  # the tenant becomes active: it starts at the current virtual time
            waiting = self._waiting[tenant] = _Waiting()
            self._vtime[tenant] = max(self._vtime.get(tenant, 0.0), self._vnow)
        waiting.table(entry)[entry.seq] = entry
        self._size += 1
        return Pushed(entry, displaced)

    def remove(self, entry: Entry) -> bool:
        """Take a waiting entry out (its client went away, or it timed out); False when it was
        no longer queued (admitted or removed already)."""
        waiting = self._waiting.get(entry.tenant)
        if waiting is None or waiting.table(entry).pop(entry.seq, None) is None:
            return False
        self._size -= 1
        if not waiting:
            del self._waiting[entry.tenant]
        return True

    def expired(self) -> list[Entry]:
        """Remove and return the entries that have waited the timeout or longer."""
        limit = self.clock() - self.timeout_s
        out = []
        # each table is in arrival order on a clock that never goes back: the expired entries
        # are its head, so a queue of 10K costs this its few oldest, not a scan of all
        for w in self._waiting.values():
            for table in (w.follow_ups, w.first_turns):
                for e in table.values():
                    if e.enqueued_at > limit:
                        break
                    out.append(e)
        out.sort(key=lambda e: e.seq)
        for e in out:
            self.remove(e)
        return out

    def order(self, held: Mapping[str, float] | None = None) -> list[Entry]:
        """The waiting entries in admission order, were there room for all (see the module's
        docstring). held: slots in use per tenant (absent: none)."""
        return [e for e, _ in self._plan(_Fits(), held or {})]

    def pick(self, room: Room, held: Mapping[str, float] | None = None) -> list[Entry]:
        """Admit, in order, every entry that fits the room; they leave the queue. held: slots in
        use per tenant (absent: none); the caller adds the admitted ones to it."""
        admitted = []
        for e, start in self._plan(room, held or {}):
            self.remove(e)
            self._vnow = max(self._vnow, start)
            self._vtime[e.tenant] = start + 1.0 / self.weight(e.tenant)
            admitted.append(e)
        return admitted

    def next_event(self) -> float | None:
        """The earliest time at which an entry times out or a first turn reaches the ceiling
        (None: nothing waits), for the caller's timer."""
        first_turn_wait = min(self.timeout_s, self.ceiling_s)
        times = []
        for w in self._waiting.values():  # the heads: each table is in arrival order
            for table, wait in ((w.follow_ups, self.timeout_s), (w.first_turns, first_turn_wait)):
                head = next(iter(table.values()), None)
                if head is not None:
                    times.append(head.enqueued_at + wait)
        return min(times, default=None)

    def _classes(self) -> list[dict[str, list[Entry]]]:
        """The three classes, each tenant -> its entries in the class in their order."""
        ceiling = self.clock() - self.ceiling_s
        starved: dict[str, list[Entry]] = {}
        follow: dict[str, list[Entry]] = {}
        rest: dict[str, list[Entry]] = {}
        for tenant, w in self._waiting.items():
            for e in w.first_turns.values():
                (starved if e.enqueued_at <= ceiling else rest).setdefault(tenant, []).append(e)
            if w.follow_ups:
                follow[tenant] = list(w.follow_ups.values())
        for cls in (starved, follow, rest):
            for entries in cls.values():
                entries.sort(key=_within)
        return [starved, follow, rest]

    def _plan(self, room: Room, held: Mapping[str, float]) -> Iterator[tuple[Entry, float]]:
        """The entries the room takes, in order, each with its tenant's virtual time when it is
        admitted (nothing changes here; pick() applies it)."""
        vtime = dict(self._vtime)
        taken = dict.fromkeys(self._waiting, 0)  # what this plan admits, per tenant
        # each tenant's entries in its own order: class, then priority and age
        mine: dict[str, list[tuple[int, Entry]]] = {}
        for rank, cls in enumerate(self._classes()):
            for tenant, in_class in cls.items():
                mine.setdefault(tenant, []).extend((rank, e) for e in in_class)
        while mine:
            # ties: the tenant whose next entry is of the earlier class, then came first
            tenant = min(
                mine,
                key=lambda t: (
                    (held.get(t, 0.0) + taken[t]) / self.weight(t),
                    vtime[t],
                    mine[t][0][0],
                    mine[t][0][1].seq,
                ),
            )
            queued = mine[tenant]
            for i, (_, e) in enumerate(queued):
                if room.fits(e.worker):
                    room.take(e.worker)
                    del queued[i]
                    yield e, vtime[tenant]
                    vtime[tenant] += 1.0 / self.weight(tenant)
                    taken[tenant] += 1
                    break
            else:
                queued.clear()  # nothing of this tenant fits this round
            if not queued:
                del mine[tenant]

    def _victim(self, now: float, follow_up: bool, tenant: str) -> Entry | None:
        """The first turn a request arriving at a full queue displaces, or None (module's
        docstring)."""
        best: tuple[float, Entry] | None = None
        for t, w in self._waiting.items():
            young = [e for e in w.first_turns.values() if now - e.enqueued_at < self.ceiling_s]
            if not young:
                continue
            share = len(w) / self.weight(t)
            # lowest priority, then newest
            e = min(young, key=lambda e: (e.priority, -e.seq))
            if best is None or share > best[0] or (share == best[0] and e.seq > best[1].seq):
                best = (share, e)
        if best is None:
            return None
        share, victim = best
        if follow_up:
            return victim
        own = self._waiting.get(tenant)
        mine = ((len(own) if own is not None else 0) + 1) / self.weight(tenant)
        return victim if victim.tenant != tenant and mine < share else None
