"""The router's L3 view (cluster/l3_view.py) against a real mooncake_master: what it reports is
what the master holds under SGLang's keys; an outage is 'unknown', never a miss; a restarted
master (empty) resets it. Against a fake master's /metrics: junk in the page does not crash it."""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from smetric_router.cluster.kv_index import L3_MEDIUM, KvIndex
from smetric_router.cluster.l3_view import EventsL3, L3Config, L3State, MasterL3, _parse_metrics
from smetric_router.core.kv_events import BlockRemoved, BlockStored, KVEventBatch
from smetric_router.core.mooncake_keys import page_keys, page_stems
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


# --- the master's /metrics read with prometheus_client's parser, junk and all ----------------

MASTER_PAGE = """\
# HELP master_key_count Total number of keys managed by the master
# TYPE master_key_count gauge
master_key_count 7
# HELP master_mount_segment_requests_total Total number of MountSegment requests received
# TYPE master_mount_segment_requests_total counter
master_mount_segment_requests_total 2
# HELP master_ping_requests_total Total number of ping requests received
# TYPE master_ping_requests_total counter
master_ping_requests_total 12
"""
JUNK = [
    "garbage without a value\n",
    'master_key_count{unterminated="x 1\n',
    "master_key_count not-a-number\n",
    "\x00\xff binary\n",
    "{} 1\n",
]
COUNTERS = {"master_key_count": 7.0, "master_mount_segment_requests_total": 2.0,
            "master_ping_requests_total": 12.0}  # fmt: skip


@pytest.mark.parametrize("junk", JUNK)
def test_junk_in_the_masters_page_costs_only_its_own_lines(junk: str) -> None:
    assert _parse_metrics(junk + MASTER_PAGE + junk) == COUNTERS
    # a labelled sample is not one of the master's (unlabelled) counters
    assert _parse_metrics(MASTER_PAGE + 'master_key_count{shard="1"} 99\n') == COUNTERS


class FakeMaster:
    """A master's /metrics page, whatever the test sets it to."""

    def __init__(self) -> None:
        self.page = MASTER_PAGE
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self.server = TestServer(app, host="127.0.0.1")

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.page)


async def test_a_malformed_page_does_not_crash_the_view() -> None:
    fake = FakeMaster()
    await fake.server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            v = MasterL3(L3Config(f"http://127.0.0.1:{fake.server.port}", health_interval_s=3600))
            await v.start(session)
            assert (v.state, v.stats.keys) == (L3State.OK, 7)
            for page in [*JUNK, "master_key_count NaN\n", "master_key_count +Inf\n", ""]:
                fake.page = page
                await v.check_health()
                # reachable and answering: up, whatever it wrote; no key count it could read
                assert (state(v), v.stats.outages, v.stats.keys) == (L3State.OK, 0, None), page
            fake.page = MASTER_PAGE
            await v.check_health()
            monotone = ("master_ping_requests_total", "master_mount_segment_requests_total")
            assert (v.stats.keys, v._counters) == (7, {k: COUNTERS[k] for k in monotone})
            await v.stop()
    finally:
        await fake.server.close()


def test_page_stems_are_each_pages_keys_without_the_suffix() -> None:
    digests = b"".join(page_digests(list(range(5 * PAGE)), PAGE))
    stems = page_stems(PREFIX, digests + b"\x01" * 7, 1)  # a partial digest is not a page
    assert [page_keys(PREFIX, digests[i * 32 : (i + 1) * 32], 1) for i in range(5)] == [
        (s + "_k", s + "_v") for s in stems
    ]
    assert stems[0].startswith(f"{PREFIX}_") and stems[0].endswith("_1")
