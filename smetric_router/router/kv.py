"""The router's view of the KV-event feeds (cluster.subscriber), as far as it needs one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class FeedStats:
    connected: bool
    resets: int
    gaps_recovered: int


class KvFeeds(Protocol):
    async def add_worker(self, url: str) -> None: ...

    async def remove_worker(self, url: str) -> None: ...

    def stats(self, url: str) -> FeedStats | None: ...

    async def stop(self) -> None: ...
