"""The emulated worker's L3 KV events (--l3-kv-events), as SGLang with the l3-events patch sends
them: one EXTERNAL BlockStored per run of consecutive stored pages with the token chain's parent,
and on a clear one EXTERNAL BlockRemoved of every page announced since; the tier announcing what
a write left in the store (here a client on a dict; tests/e2e/test_l3_events_view.py runs it on a
real Mooncake store behind a router)."""

from __future__ import annotations

import asyncio

import pytest

from smetric_router.core.kv_events import EXTERNAL, BlockRemoved, BlockStored, KVCacheEvent
from smetric_router.emulator import l3_events
from smetric_router.emulator.l3_events import L3Announcer
from smetric_router.emulator.mooncake_tier import MooncakeTier, TierOptions
from smetric_router.features.hashing import block_hash, page_digests
from tests.helpers.polling import eventually

PAGE = 16
CHAIN = [(11, None), (12, 11), (13, 12), (14, 13)]  # (page, the page before it)


def announcer() -> tuple[L3Announcer, list[list[KVCacheEvent]]]:
    published: list[list[KVCacheEvent]] = []
    return L3Announcer(published.append, PAGE), published


def stored(hashes: list[int], parent: int | None) -> BlockStored:
    return BlockStored(hashes, parent, [], PAGE, None, medium=EXTERNAL)


def test_a_write_is_announced_per_run_of_stored_pages_with_its_chains_parent() -> None:
    a, published = announcer()
    a.stored(CHAIN, [True, True, True, True])
    assert published == [[stored([11, 12, 13, 14], None)]]
    # the 2nd page failed: two runs, the second under the page that is not in L3
    a.stored(CHAIN, [True, False, True, True])
    assert published[-1] == [stored([11], None), stored([13, 14], 12)]
    # pages of another chain in one write start their own run
    a.stored([(21, 5), (22, 21), (31, 7)], [True, True, True])
    assert published[-1] == [stored([21, 22], 5), stored([31], 7)]


def test_a_write_that_stored_nothing_publishes_nothing() -> None:
    a, published = announcer()
    a.stored(CHAIN, [False] * 4)
    a.cleared()
    assert published == []


def test_a_clear_removes_every_page_announced_since_the_last_once() -> None:
    a, published = announcer()
    a.stored(CHAIN[:2], [True, True])
    a.stored(CHAIN, [True, True, True, False])  # 11 and 12 again: listed once
    a.cleared()
    assert published[-1] == [BlockRemoved([11, 12, 13], medium=EXTERNAL)]
    a.cleared()  # nothing announced since
    assert len(published) == 3


def test_a_clear_lists_at_most_the_newest_announced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(l3_events, "MAX_ANNOUNCED", 3)
    a, published = announcer()
    a.stored(CHAIN, [True] * 4)
    a.stored(CHAIN[:1], [True])  # 11 announced again: now the newest
    a.cleared()
    assert published[-1] == [BlockRemoved([13, 14, 11], medium=EXTERNAL)]


class FakeStore:
    """A Mooncake client's calls on a dict: keys it `has`, puts that fail while `failing`."""

    def __init__(self) -> None:
        self.has: set[str] = set()
        self.failing = False

    def batch_is_exist(self, keys: list[str]) -> list[int]:
        return [int(k in self.has) for k in keys]

    def put_batch(self, keys: list[str], values: list[bytes]) -> int:
        if self.failing:
            return -1
        self.has.update(keys)
        return 0

    def get_batch(self, keys: list[str]) -> list[bytes]:
        return [b"x" for _ in keys]

    def health_check(self) -> int:
        return 0

    def remove_all(self) -> int:
        self.has.clear()
        return 0

    def close(self) -> int:
        return 0


async def test_the_tier_announces_what_the_store_holds_after_a_write() -> None:
    store = FakeStore()
    tier = MooncakeTier(store, "m", PAGE, TierOptions(health_interval_s=0.05))
    published: list[list[KVCacheEvent]] = []
    tier.announcer = L3Announcer(published.append, PAGE)
    try:
        ids = list(range(1000, 1000 + 4 * PAGE + 1))
        hashes = [block_hash(d) for d in page_digests(ids, PAGE)]
        await tier.arrive("r1", ids, [])

        async def written() -> bool:
            return tier.stats.pending_keys == 0

        # the 3rd page's V object is there already (another worker wrote it): it counts
        keys = tier._keys(hashes)
        store.has.add(keys[5])
        tier.store(hashes[:3])
        await eventually(written, "the write")
        assert published == [[BlockStored(hashes[:3], None, [], PAGE, None, medium=EXTERNAL)]]
        # a write the store refuses announces nothing
        store.failing = True
        tier.store(hashes[3:])
        await eventually(written, "the refused write")
        assert len(published) == 1
        assert await tier.clear()
        assert published[-1] == [BlockRemoved(hashes[:3], medium=EXTERNAL)]
    finally:
        await asyncio.to_thread(tier.close)
