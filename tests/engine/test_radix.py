"""The paged radix cache on its own: prefix matching, LRU order, locks, host tier, events."""

from __future__ import annotations

from smetric_router.core.kv_events import (
    CPU_PINNED,
    GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
)
from smetric_router.engine.radix import RadixCache

PS = 4


def seq(tag: int, pages: int) -> tuple[list[int], list[int]]:
    """Synthetic hashes (chained by construction) and tokens for a sequence of whole pages."""
    hashes = [tag * 1000 + i for i in range(pages)]
    tokens = [tag * 100 + i for i in range(pages * PS)]
    return hashes, tokens


def branch(base: list[int], tag: int, extra: int) -> list[int]:
    return base + [tag * 1000 + 500 + i for i in range(extra)]


def test_match_returns_leading_pages_only() -> None:
    c = RadixCache(PS, gpu_pages=100)
    h, t = seq(1, 5)
    c.insert(h, t, 0, 5)
    gpu, host = c.match([*h[:3], 999])
    assert [n.hash for n in gpu] == h[:3] and host == []
    assert c.match([h[1]])[0] and c.match([42])[0] == []
    assert c.gpu_used == 5


def test_insert_events_are_coalesced_and_parent_linked() -> None:
    c = RadixCache(PS, gpu_pages=100)
    h, t = seq(1, 4)
    _, added, ev = c.insert(h, t, 0, 2)
    assert added == 2
    assert ev == [BlockStored(h[:2], None, t[: 2 * PS], PS, None, GPU)]
    _, added, ev = c.insert(h, t, 2, 4)
    assert added == 2
    assert ev == [BlockStored(h[2:], h[1], t[2 * PS :], PS, None, GPU)]
    # re-inserting cached pages stores nothing
    assert c.insert(h, t, 0, 4)[1:] == (0, [])


def test_lru_evicts_least_recent_leaves_first() -> None:
    c = RadixCache(PS, gpu_pages=100)
    a, ta = seq(1, 3)
    b, tb = seq(2, 3)
    c.insert(a, ta, 0, 3)
    c.insert(b, tb, 0, 3)
    c.touch(c.match(a)[0][-1])  # a is now more recent than b
    ev = c.evict_gpu(2)
    assert ev == [BlockRemoved([b[2], b[1]], GPU)]  # leaf first, then its parent
    ev = c.evict_gpu(10)
    assert ev == [BlockRemoved([b[0], a[2], a[1], a[0]], GPU)]
    assert c.gpu_used == 0 and not c.nodes


def test_shared_prefix_survives_until_all_branches_go() -> None:
    c = RadixCache(PS, gpu_pages=100)
    base, tok = seq(1, 2)
    x = branch(base, 3, 1)
    y = branch(base, 4, 1)
    toks = tok + [0] * PS
    c.insert(x, toks, 0, 3)
    c.insert(y, toks, 2, 3)
    ev = c.evict_gpu(2)
    assert ev == [BlockRemoved([x[2], y[2]], GPU)]
    assert len(c.match(base)[0]) == 2


def test_locked_path_is_never_evicted() -> None:
    c = RadixCache(PS, gpu_pages=100)
    a, ta = seq(1, 3)
    b, tb = seq(2, 2)
    deepest, _, _ = c.insert(a, ta, 0, 3)
    c.insert(b, tb, 0, 2)
    c.lock(deepest)
    ev = c.evict_gpu(10)
    assert ev == [BlockRemoved([b[1], b[0]], GPU)]
    assert len(c.match(a)[0]) == 3
    c.unlock(deepest)
    assert c.evict_gpu(10) == [BlockRemoved([a[2], a[1], a[0]], GPU)]


def test_host_tier_write_through_and_load_back() -> None:
    c = RadixCache(PS, gpu_pages=100, host_pages=100)
    a, ta = seq(1, 3)
    _, _, ev = c.insert(a, ta, 0, 3)
    assert ev == [
        BlockStored(a, None, ta, PS, None, GPU),
        BlockStored(a, None, ta, PS, None, CPU_PINNED),
    ]
    assert c.evict_gpu(2) == [BlockRemoved([a[2], a[1]], GPU)]  # host copies stay
    gpu, host = c.match(a)
    assert [n.hash for n in gpu] == a[:1] and [n.hash for n in host] == a[1:]
    _, added, ev = c.insert(a, ta, 1, 3)  # load back
    assert added == 2
    assert ev == [BlockStored(a[1:], a[0], ta[PS:], PS, None, GPU)]
    assert len(c.match(a)[0]) == 3 and c.host_used == 3


def test_host_tier_lru_eviction() -> None:
    c = RadixCache(PS, gpu_pages=100, host_pages=4)
    a, ta = seq(1, 2)
    b, tb = seq(2, 2)
    c.insert(a, ta, 0, 2)
    c.insert(b, tb, 0, 2)
    c.evict_gpu(4)  # all four pages now host-only; a is the older
    assert c.evict_host(1) == [BlockRemoved([a[1]], CPU_PINNED)]
    d, td = seq(3, 2)
    _, _, ev = c.insert(d, td, 0, 2)  # one free host page, then room made by evicting a[0]
    assert ev[0] == BlockRemoved([a[0]], CPU_PINNED)
    assert ev[-1] == BlockStored(d, None, td, PS, None, CPU_PINNED)
    assert a[0] not in c.nodes and c.host_used == 4
    e, te = seq(4, 1)
    _, _, ev = c.insert(e, te, 0, 1)  # d is on the GPU: only b's leaf can go
    assert ev[0] == BlockRemoved([b[1]], CPU_PINNED)


def test_clear() -> None:
    c = RadixCache(PS, gpu_pages=100, host_pages=100)
    a, ta = seq(1, 2)
    c.insert(a, ta, 0, 2)
    assert c.clear() == [AllBlocksCleared()]
    assert c.match(a) == ([], []) and c.gpu_used == 0 and c.host_used == 0


def test_host_room_for_new_pages_evicts_in_lru_order_then_runs_out() -> None:
    c = RadixCache(PS, gpu_pages=100, host_pages=4)
    b, tb = seq(2, 2)
    c.insert(b, tb, 0, 2)
    c.evict_gpu(2)  # b is host-only
    a, ta = seq(1, 3)
    _, _, ev = c.insert(a, ta, 0, 3)  # two free host pages, then b's leaf makes room
    assert ev == [
        BlockRemoved([b[1]], CPU_PINNED),
        BlockStored(a, None, ta, PS, None, GPU),
        BlockStored(a, None, ta, PS, None, CPU_PINNED),
    ]
    d, td = seq(3, 3)
    _, _, ev = c.insert(d, td, 0, 3)  # b[0] became a leaf and goes; then nothing is evictable
    assert ev == [
        BlockRemoved([b[0]], CPU_PINNED),
        BlockStored(d, None, td, PS, None, GPU),
        BlockStored(d[:1], None, td[:PS], PS, None, CPU_PINNED),
    ]
    assert c.host_used == 4 and [c.nodes[h].on_host for h in d] == [True, False, False]


def test_insert_runs_span_loaded_and_new_pages() -> None:
    c = RadixCache(PS, gpu_pages=100, host_pages=5)
    a, ta = seq(1, 3)
    c.insert(a, ta, 0, 3)
    c.evict_gpu(2)  # a[1:] host-only
    x = branch(a, 5, 3)
    tx = ta + [7] * (3 * PS)
    _, added, ev = c.insert(x, tx, 1, 6)  # load a[1:] back, then three new pages, room for two
    assert added == 5
    assert ev == [
        BlockStored(x[1:], a[0], tx[PS:], PS, None, GPU),
        BlockStored(x[3:5], a[2], tx[3 * PS : 5 * PS], PS, None, CPU_PINNED),
    ]
    assert c.match_len(x) == (6, 0) and c.host_used == 5
