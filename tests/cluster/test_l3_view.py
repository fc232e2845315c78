"""The router's L3 view (cluster/l3_view.py) against a real mooncake_master: what it reports is
what the master holds under SGLang's keys; an outage is 'unknown', never a miss; a restarted
master (empty) resets it."""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from smetric_router.cluster.kv_index import L3_MEDIUM, KvIndex
from smetric_router.cluster.l3_view import EventsL3, L3Config, L3State, MasterL3
from smetric_router.core.kv_events import BlockRemoved, BlockStored, KVEventBatch
from smetric_router.core.mooncake_keys import page_stems
from smetric_router.core.types import RequestFeatures
from smetric_router.features.hashing import block_hash, page_digests
from tests.mooncake_master import Master, store_client

PAGE = 16
PREFIX = "smetric-tiny-qwen3"


def features(ids: list[int]) -> RequestFeatures:
    digests = page_digests(ids, PAGE)
    return RequestFeatures(
        prompt_len=len(ids),
        page_hashes=array("q", (block_hash(d) for d in digests)),
        page_size=PAGE,
        turn=1,
        est_hit=0,
        page_digests=b"".join(digests),
    )


def put(store: Any, key: str) -> None:
    # After a master restart the client re-mounts its segment within ~1 s; until then puts fail.
    deadline = time.monotonic() + 30
    while (rc := store.put(key, b"x" * 64)) != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rc == 0, f"put {key}: {rc}"


def put_pages(store: Any, f: RequestFeatures, pages: int) -> None:
    for stem in page_stems(PREFIX, f.page_digests, 0)[:pages]:
        put(store, stem + "_k")
        put(store, stem + "_v")


def state(view: MasterL3) -> L3State:
    """The view's state read afresh: mypy keeps `view.state` narrowed by an earlier assert across
    the health check that changes it."""
    return view.state


@pytest.fixture(scope="module")
def master() -> Iterator[Master]:
    with Master() as m:
        yield m


@pytest.fixture(scope="module")
def store(master: Master) -> Iterator[Any]:
    client = store_client(master)
    yield client
    client.close()  # before the master goes: unmounts its segment, stops its pings


@pytest.fixture
async def view(master: Master) -> AsyncIterator[MasterL3]:
    async with aiohttp.ClientSession() as session:
        v = MasterL3(L3Config(master.url, budget_s=2.0, ttl_s=60, health_interval_s=3600))
        await v.start(session)
        yield v
        await v.stop()


async def test_reports_the_leading_pages_whose_k_and_v_objects_the_master_holds(
    master: Master, store: Any, view: MasterL3
) -> None:
    f = features(list(range(1000, 1000 + 12 * PAGE + 5)))  # 12 full pages and a partial one
    assert view.state is L3State.OK
    assert await view.lookup(PREFIX, f) == 0
    put_pages(store, f, 5)
    assert await view.lookup(PREFIX, f) == 5 * PAGE
    # page 6 with its K object only is not loadable; the run stops there
    stems = page_stems(PREFIX, f.page_digests, 0)
    put(store, stems[5] + "_k")
    put(store, stems[7] + "_k")
    put(store, stems[7] + "_v")
    assert await view.lookup(PREFIX, f) == 5 * PAGE
    # the keys it asked for are the ones in the master (its own listing)
    assert {k for s in stems[:5] for k in (s + "_k", s + "_v")} <= master.keys()
    # another model's prefix is another tenant
    assert await view.lookup("other-model", f) == 0
    assert view.stats.lookups["hit"] == 2 and view.stats.lookups["miss"] == 2


async def test_outage_is_unknown_and_a_restarted_master_resets_the_view(
    master: Master, store: Any, view: MasterL3
) -> None:
    f = features(list(range(5000, 5000 + 8 * PAGE)))
    put_pages(store, f, 8)
    assert await view.lookup(PREFIX, f) == 8 * PAGE  # now cached for ttl_s
    master.kill()
    await view.check_health()
    assert view.state is L3State.UNKNOWN and view.stats.outages == 1
    assert await view.lookup(PREFIX, f) is None  # not 0: the pages may well still be there
    assert view.stats.lookups["unknown"] == 1
    master.start()
    await view.check_health()
    assert state(view) is L3State.OK and view.stats.resets == 1
    assert await view.lookup(PREFIX, f) == 0  # the master keeps keys in memory: all gone


async def test_a_restart_between_two_health_checks_is_noticed_by_its_counters(
    master: Master, store: Any, view: MasterL3
) -> None:
    f = features(list(range(9000, 9000 + 4 * PAGE)))
    put_pages(store, f, 4)
    assert await view.lookup(PREFIX, f) == 4 * PAGE
    for _ in range(100):  # the client's pings move the master's counters on
        await view.check_health()
        if view._counters.get("master_ping_requests_total", 0) >= 2:
            break
        await asyncio.sleep(0.1)
    master.kill()
    master.start()  # never seen down
    await view.check_health()
    assert view.state is L3State.OK and view.stats.outages == 0 and view.stats.resets == 1
    assert await view.lookup(PREFIX, f) == 0


async def test_a_slow_master_is_unknown_within_the_budget(master: Master) -> None:
    async with aiohttp.ClientSession() as session:
        v = MasterL3(L3Config(master.url, budget_s=1e-6, health_interval_s=3600))
        await v.start(session)
        f = features(list(range(64 * PAGE)))
        assert await v.lookup(PREFIX, f) is None
        assert v.stats.lookups["timeout"] == 1
        await v.stop()


async def test_an_unreachable_master_at_start_is_unknown_not_a_failure() -> None:
    async with aiohttp.ClientSession() as session:
        v = MasterL3(L3Config("http://127.0.0.1:9", health_interval_s=3600))
        await v.start(session)
        assert v.state is L3State.UNKNOWN
        assert await v.lookup(PREFIX, features(list(range(2 * PAGE)))) is None
        await v.stop()


def l3_event(stored: bool, f: RequestFeatures, pages: int) -> KVEventBatch:
    hashes = list(f.page_hashes[:pages])
    ev: BlockStored | BlockRemoved = (
        BlockStored(hashes, None, [], PAGE, None, medium=L3_MEDIUM)
        if stored
        else BlockRemoved(hashes, medium=L3_MEDIUM)
    )
    return KVEventBatch(0.0, [ev])


async def test_events_source_keeps_one_l3_set_for_all_workers() -> None:
    index = KvIndex()
    f = features(list(range(6 * PAGE)))
    events = EventsL3(index)
    index.apply("http://a:1", l3_event(True, f, 4))
    assert await events.lookup(PREFIX, f) == 4 * PAGE
    # L3 is not a worker's tier: no local hit anywhere, and another worker's removal counts
    assert index.match(f.page_hashes, PAGE) == {"http://a:1": (0, 0)}
    index.apply("http://b:1", l3_event(False, f, 1))
    assert await events.lookup(PREFIX, f) == 0
    assert index.l3_pages == 3
    index.clear_l3()
    assert index.l3_pages == 0
