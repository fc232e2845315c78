"""InflightPrefixes: refcounts, leading runs, the grace after a request ends (injected clock)."""

from __future__ import annotations

from smetric_router.cluster.inflight import InflightPrefixes
from smetric_router.cluster.kv_index import KvIndex
from smetric_router.core.kv_events import GPU, BlockRemoved, BlockStored, KVEventBatch

PAGE = 16
A, B = "http://a", "http://b"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def chain(tag: int, n: int, base: list[int] | None = None) -> list[int]:
    """n page hashes: `base` followed by pages of their own (a chain extending `base`)."""
    head = list(base or [])
    return head + [tag * 1000 + i for i in range(len(head), n)]


def test_leading_run_per_worker() -> None:
    view = InflightPrefixes(clock=Clock())
    first = chain(1, 6)
    view.hold(B, first)
    follow_up = chain(2, 10, base=first)
    assert view.match(follow_up, PAGE) == {B: 6 * PAGE}
    assert view.match(first[:3], PAGE) == {B: 3 * PAGE}
    assert view.match(chain(3, 4), PAGE) == {}  # another session: nothing in flight
    assert view.match([], PAGE) == {}
    view.hold(A, first[:2])  # a fork of the first two pages on A
    assert view.match(follow_up, PAGE) == {A: 2 * PAGE, B: 6 * PAGE}
    assert view.pages(B) == 6 and view.pages(A) == 2


def test_refcounts_keep_shared_pages_until_the_last_holder_ends() -> None:
    view = InflightPrefixes(grace_s=0)
    shared = chain(1, 4)
    one, two = chain(2, 8, base=shared), chain(3, 6, base=shared)
    h1, h2 = view.hold(B, one), view.hold(B, two)
    assert view.pages(B) == 4 + 4 + 2
    view.release(h1)
    assert view.match(one, PAGE) == {B: 4 * PAGE}  # the shared part is still in flight (two)
    assert view.match(two, PAGE) == {B: 6 * PAGE}
    view.release(h1)  # a second release of the same hold changes nothing
    assert view.match(two, PAGE) == {B: 6 * PAGE}
    view.release(h2)
    assert view.match(two, PAGE) == {} and view.pages(B) == 0


def test_ended_requests_stay_for_the_grace_then_expire() -> None:
    clock = Clock()
    view = InflightPrefixes(grace_s=2.0, clock=clock)
    pages = chain(1, 5)
    hold = view.hold(B, pages)
    clock.now += 60  # in flight: no expiry however long it runs
    assert view.match(pages, PAGE) == {B: 5 * PAGE}
    view.release(hold)
    clock.now += 1.9
    assert view.match(pages, PAGE) == {B: 5 * PAGE}
    clock.now += 0.2
    assert view.match(pages, PAGE) == {} and view.pages(B) == 0


def test_a_request_the_worker_never_ran_is_dropped_at_once() -> None:
    view = InflightPrefixes(grace_s=2.0, clock=Clock())
    hold = view.hold(B, chain(1, 3))
    view.release(hold, grace=False)
    assert view.match(chain(1, 3), PAGE) == {}


def test_grace_expiry_keeps_pages_still_held_by_a_live_request() -> None:
    clock = Clock()
    view = InflightPrefixes(grace_s=2.0, clock=clock)
    pages = chain(1, 4)
    done = view.hold(B, pages)
    view.hold(B, pages)  # a concurrent request with the same prompt, still running
    view.release(done)
    clock.now += 5
    assert view.match(pages, PAGE) == {B: 4 * PAGE}


def test_removed_worker_is_forgotten_and_its_late_releases_are_harmless() -> None:
    clock = Clock()
    view = InflightPrefixes(grace_s=2.0, clock=clock)
    pages = chain(1, 4)
    live, ended = view.hold(B, pages), view.hold(B, pages)
    view.release(ended)
    view.remove_worker(B)
    assert view.match(pages, PAGE) == {}
    again = view.hold(B, pages[:2])  # re-added (or back healthy) and sent a new request
    view.release(live, grace=False)  # the old holds end into the detached table
    clock.now += 5
    assert view.match(pages, PAGE) == {B: 2 * PAGE}
    view.release(again, grace=False)
    assert view.match(pages, PAGE) == {} and view.pages(B) == 0


def test_eviction_events_end_the_grace_but_not_live_requests() -> None:
    clock = Clock()
    view = InflightPrefixes(grace_s=2.0, clock=clock)
    ended, running = chain(1, 4), chain(2, 3)
    view.release(view.hold(B, ended))
    view.hold(B, running)
    view.release(view.hold(A, ended))
    view.forget_ended(B)  # B's KV events removed pages: the index speaks for B now
    assert view.match(ended, PAGE) == {A: 4 * PAGE}
    assert view.match(running, PAGE) == {B: 3 * PAGE}
    later = view.hold(B, ended)
    clock.now += 5  # the forgotten entry's expiry must not touch what came after
    assert view.match(ended, PAGE) == {B: 4 * PAGE}
    view.release(later)
    assert view.match(ended, PAGE) == {B: 4 * PAGE}  # its own grace
    clock.now += 2
    assert view.match(ended, PAGE) == {}


def test_kv_index_reports_evictions_and_clears() -> None:
    index = KvIndex()
    told: list[str] = []
    index.on_evicted = told.append
    stored = BlockStored(
        block_hashes=[1, 2],
        parent_block_hash=None,
        token_ids=[0] * 32,
        block_size=PAGE,
        lora_id=None,
        medium=GPU,
    )
    index.apply(B, KVEventBatch(0.0, [stored]))
    assert told == []
    index.apply(B, KVEventBatch(0.0, [BlockRemoved(block_hashes=[2], medium=GPU)]))
    assert told == [B]
    index.clear(A)
    assert told == [B, A]
