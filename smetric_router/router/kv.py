"""What the router needs of the KV-event feeds (cluster.subscriber.KvEventHub)."""

from __future__ import annotations

from typing import Protocol


class FeedStats(Protocol):
    @property
    def connected(self) -> bool: ...

    @property
    def resets(self) -> int: ...

    @property
    def batches_applied(self) -> int: ...

    @property
    def gaps_recovered(self) -> int: ...

    @property
    def decode_errors(self) -> int: ...

    # a silent feed noticed and reconnected, and one refused for naming a foreign host
    @property
    def stalls(self) -> int: ...

    @property
    def reconnects(self) -> int: ...

    @property
    def refused(self) -> bool: ...

    @property
    def events_enabled(self) -> bool | None: ...

    @property
    def warmed(self) -> bool: ...


class KvFeeds(Protocol):
    async def add_worker(self, url: str) -> None: ...

    async def remove_worker(self, url: str) -> None: ...

    def stats(self, url: str) -> FeedStats | None: ...

    async def stop(self) -> None: ...
