"""What every provider hands over: the workers it wants registered now, keyed by URL.

A provider never registers anything itself. It keeps its own view of the source (pods, a file)
and, on each change there, turns the view into the full set of workers it wants; `diff` turns
two such sets into ordered changes, removals first, so that a worker whose pod moved to another
IP is gone (its KV index dropped) before the new address is added.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from smetric_router.router.workers import WorkerSpec


class DiscoveryError(RuntimeError):
    """A discovery source cannot be used (bad configuration, unreadable credentials)."""


@dataclass(frozen=True, slots=True)
class Discovered:
    """One worker a source wants: its spec and where it came from, for logs."""

    spec: WorkerSpec
    source: str  # "pod ns/name", "file workers.yaml entry 2"

    @property
    def url(self) -> str:
        return self.spec.url


@dataclass(frozen=True, slots=True)
class Added:
    worker: Discovered
    reason: str  # metric label: pod_ready, file_entry


@dataclass(frozen=True, slots=True)
class Removed:
    worker: Discovered
    reason: str  # metric label: deleted, not_ready, ip_changed, resync, ...


Change = Added | Removed
Wanted = Mapping[str, Discovered]  # url -> worker
# Applies changes in order; a provider awaits it before reading on, so order is kept.
Apply = Callable[[Sequence[Change]], Awaitable[None]]


class Provider(Protocol):
    """A source of workers. `run` lists, watches and calls `apply` until cancelled."""

    name: str  # kubernetes | file: the metrics' provider label

    async def run(self, apply: Apply) -> None: ...


def diff(
    before: Wanted, after: Wanted, why_removed: Callable[[Discovered], str], added_reason: str
) -> list[Change]:
    """The changes from `before` to `after`: removals first, then additions. A worker whose spec
    changed (role, bootstrap port) is removed and added again, as an operator would have to."""
    removed: list[Change] = [
        Removed(w, why_removed(w))
        for url, w in before.items()
        if url not in after or after[url].spec != w.spec
    ]
    added: list[Change] = [
        Added(w, added_reason)
        for url, w in after.items()
        if url not in before or before[url].spec != w.spec
    ]
    return removed + added
