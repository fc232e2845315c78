"""The engine: scheduling, prefix reuse across tiers, KV events, flush, determinism."""

from __future__ import annotations

from smetric_router.core.kv_events import (
    CPU_PINNED,
    GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)
from smetric_router.engine.api import CachedTokens, EngineConfig, EngineRequest, StepResult
from smetric_router.engine.engine import Engine
from smetric_router.engine.global_tier import GlobalTier
from smetric_router.features.hashing import page_hashes

PS = 16


def toks(tag: int, n: int) -> list[int]:
    return [tag * 10_000 + i for i in range(n)]


def run(engine: Engine, max_steps: int = 10_000) -> list[StepResult]:
    out = []
    while engine.has_work():
        out.append(engine.step())
        assert len(out) < max_steps, "engine made no progress"
    return out


def scheduled(results: list[StepResult]) -> dict[str, CachedTokens]:
    return {rid: c for r in results for rid, c in r.scheduled}


def events(results: list[StepResult]) -> list[KVCacheEvent]:
    return [e for r in results for e in r.kv_events]


def test_all_requests_finish_and_emit_their_outputs() -> None:
    e = Engine(EngineConfig(page_size=PS, chunked_prefill_size=512, max_running_requests=4))
    for i in range(10):
        e.add_request(EngineRequest(f"r{i}", toks(i, 300 + 37 * i), toks(99, 5 + i)))
    results = run(e)
    finished = [rid for r in results for rid in r.finished]
    assert sorted(finished) == sorted(f"r{i}" for i in range(10))
    emitted: dict[str, int] = {}
    for r in results:
        for rid, n in r.emitted:
            emitted[rid] = emitted.get(rid, 0) + n
    assert emitted == {f"r{i}": 5 + i for i in range(10)}
    assert all(r.duration > 0 for r in results)
    assert e.load().num_running_reqs == 0 and e.load().num_used_tokens == 0


def test_chunking_respects_the_budget_and_fcfs() -> None:
    budget = 256
    e = Engine(EngineConfig(page_size=PS, chunked_prefill_size=budget, max_running_requests=8))
    sizes = [600, 100, 300]
    for i, n in enumerate(sizes):
        e.add_request(EngineRequest(f"r{i}", toks(i, n), [1, 2]))
    order = [rid for r in run(e) for rid, _ in r.scheduled]
    assert order == ["r0", "r1", "r2"]
    # r0 alone needs ceil(600/256) = 3 steps before its first token
    e2 = Engine(EngineConfig(page_size=PS, chunked_prefill_size=budget))
    e2.add_request(EngineRequest("a", toks(1, 600), [1, 2]))
    steps = []
    while e2.has_work():
        steps.append(e2.step())
    first = next(i for i, s in enumerate(steps) if s.emitted)
    assert first == 2
    assert steps[0].duration > steps[-1].duration  # a 256-token chunk vs one decode token


def test_budget_limits_tokens_per_step() -> None:
    e = Engine(EngineConfig(page_size=PS, chunked_prefill_size=1000))
    for i in range(5):
        e.add_request(EngineRequest(f"r{i}", toks(i, 400), [7]))
    r = e.step()
    assert [rid for rid, _ in r.scheduled] == ["r0", "r1", "r2"]  # 400 + 400 + 200
    r = e.step()
    assert [rid for rid, _ in r.scheduled] == ["r3", "r4"]  # r2's last 200 first, then 400 + 400
    assert e.step().scheduled == []


def test_follow_up_hits_the_cache_of_prompt_and_output() -> None:
    e = Engine(EngineConfig(page_size=PS))
    prompt, output = toks(1, 200), toks(2, 40)
    e.add_request(EngineRequest("t0", prompt, output))
    run(e)
    follow = prompt + output + toks(3, 50)
    assert e.match_prefix(follow) == CachedTokens(device=(240 // PS) * PS)
    e.add_request(EngineRequest("t1", follow, [5]))
    res = run(e)
    assert scheduled(res)["t1"] == CachedTokens(device=(240 // PS) * PS)
    assert e.load().cache_hit_rate > 0


def test_full_hit_still_computes_the_last_token() -> None:
    e = Engine(EngineConfig(page_size=PS))
    prompt = toks(1, 4 * PS)
    e.add_request(EngineRequest("a", prompt, [1]))
    run(e)
    e.add_request(EngineRequest("b", prompt, [1]))
    assert scheduled(run(e))["b"].device == 3 * PS


def test_events_match_sglang_page_hashes_and_are_parent_linked() -> None:
    e = Engine(EngineConfig(page_size=PS, chunked_prefill_size=64))
    prompt, output = toks(1, 150), toks(2, 30)
    e.add_request(EngineRequest("a", prompt, output))
    stored = [ev for ev in events(run(e)) if isinstance(ev, BlockStored)]
    hashes = page_hashes(prompt + output, PS)
    assert [h for ev in stored for h in ev.block_hashes] == hashes
    assert len(stored) == 4  # three 64-token chunks' full pages, then the output pages at finish
    for ev in stored:
        first = hashes.index(ev.block_hashes[0])
        assert ev.parent_block_hash == (hashes[first - 1] if first else None)
        assert ev.token_ids == (prompt + output)[first * PS : (first + len(ev.block_hashes)) * PS]
        assert ev.medium == GPU and ev.block_size == PS and ev.lora_id is None


def test_eviction_when_kv_is_exhausted_and_waiting_until_room() -> None:
    # 20 pages of GPU KV: each request needs 13 pages, so they run one at a time
    e = Engine(EngineConfig(page_size=PS, gpu_kv_tokens=20 * PS, max_running_requests=8))
    for i in range(3):
        e.add_request(EngineRequest(f"r{i}", toks(i, 10 * PS), toks(9, 3 * PS)))
    first = e.step()
    assert [rid for rid, _ in first.scheduled] == ["r0"]
    assert e.load().num_waiting_reqs == 2
    res = run(e)
    removed = [h for ev in events(res) if isinstance(ev, BlockRemoved) for h in ev.block_hashes]
    assert set(page_hashes(toks(0, 10 * PS) + toks(9, 3 * PS), PS)) <= set(removed)
    assert sorted(rid for r in res for rid in r.finished) == ["r0", "r1", "r2"]


def test_request_larger_than_the_pool_is_dropped_not_deadlocked() -> None:
    e = Engine(EngineConfig(page_size=PS, gpu_kv_tokens=4 * PS))
    e.add_request(EngineRequest("big", toks(1, 10 * PS), [1]))
    e.add_request(EngineRequest("ok", toks(2, PS), [1]))
    res = run(e)
    assert [rid for r in res for rid in r.finished] == ["big", "ok"]


def test_host_tier_hit_is_loaded_back_and_costs_transfer_time() -> None:
    cfg = EngineConfig(page_size=PS, gpu_kv_tokens=20 * PS, host_kv_tokens=100 * PS)
    e = Engine(cfg)
    a = toks(1, 10 * PS)
    e.add_request(EngineRequest("a", a, [1]))
    ev_a = events(run(e))
    assert any(isinstance(x, BlockStored) and x.medium == CPU_PINNED for x in ev_a)
    e.add_request(EngineRequest("b", toks(2, 15 * PS), [1]))  # pushes a's pages off the GPU
    run(e)
    assert e.match_prefix(a).host > 0
    follow = [*a, 5, 6, 7]
    hit = e.match_prefix(follow)
    e.add_request(EngineRequest("c", follow, [1]))
    step = e.step()
    assert step.scheduled == [("c", hit)] and hit.host > 0
    compute = e.timing.step_seconds([(hit.total, len(follow) - hit.total)], 0, 0)
    assert step.duration == compute + e.timing.host_load_seconds(hit.host)
    loaded = [x for x in step.kv_events if isinstance(x, BlockStored) and x.medium == GPU]
    assert loaded and loaded[0].block_hashes[0] == page_hashes(a, PS)[hit.device // PS]


def test_global_tier_is_shared_between_engines() -> None:
    tier = GlobalTier(page_size=PS)
    a, b = Engine(EngineConfig(page_size=PS), tier), Engine(EngineConfig(page_size=PS), tier)
    prompt = toks(1, 8 * PS)
    a.add_request(EngineRequest("x", prompt, toks(2, PS)))
    run(a)
    follow = prompt + toks(2, PS) + [1]
    assert b.match_prefix(follow) == CachedTokens(storage=9 * PS)
    b.add_request(EngineRequest("y", follow, [1]))
    assert scheduled(run(b))["y"] == CachedTokens(storage=9 * PS)
    assert b.match_prefix(follow).device == 9 * PS


def test_global_tier_lru_capacity() -> None:
    tier = GlobalTier(capacity_tokens=3 * PS, page_size=PS)
    tier.store([1, 2, 3])
    assert tier.lookup([1, 9]) == 1
    tier.store([4])  # evicts 2, the least recently used
    assert 2 not in tier and tier.peek([1]) == 1 and tier.peek([3, 4]) == 2


def test_flush_refused_while_busy_then_clears() -> None:
    e = Engine(EngineConfig(page_size=PS))
    e.add_request(EngineRequest("a", toks(1, 100), [1, 2, 3]))
    assert not e.flush()
    run(e)
    assert e.flush()
    assert e.drain_events() == [AllBlocksCleared()]
    assert e.drain_events() == []
    assert e.match_prefix(toks(1, 100)).total == 0


def test_abort_releases_everything() -> None:
    e = Engine(EngineConfig(page_size=PS, chunked_prefill_size=64))
    e.add_request(EngineRequest("a", toks(1, 500), [1]))
    e.add_request(EngineRequest("b", toks(2, 500), [1]))
    e.step()
    e.abort("a")
    e.abort("b")
    assert not e.has_work() and e.load().num_used_tokens == 0
    assert e.flush()


def test_deterministic() -> None:
    def trace() -> list[tuple[object, ...]]:
        e = Engine(EngineConfig(page_size=PS, chunked_prefill_size=300, gpu_kv_tokens=60 * PS))
        for i in range(12):
            e.add_request(EngineRequest(f"r{i}", toks(i % 4, 100 + 50 * i), toks(i, 1 + i % 5)))
        return [(r.duration, r.scheduled, r.emitted, r.finished, r.kv_events) for r in run(e)]

    assert trace() == trace()


class _Prefetch:
    """A Prefetcher stand-in: what each request's prefetch has brought, None while it waits."""

    def __init__(self) -> None:
        self.started: dict[str, int] = {}
        self.ready: dict[str, int | None] = {}

    def start(self, rid: str, pages: int) -> None:
        self.started[rid] = pages

    def poll(self, rid: str) -> int | None:
        return self.ready.get(rid, 0)


def test_a_request_still_prefetching_is_passed_over_and_takes_only_what_arrived() -> None:
    tier = GlobalTier(page_size=PS)
    prompt = toks(1, 8 * PS)
    tier.store(page_hashes(prompt, PS))
    e = Engine(EngineConfig(page_size=PS), tier)
    pf = _Prefetch()
    e.prefetcher = pf
    follow = [*prompt, 7, 8, 9]
    e.add_request(EngineRequest("waits", follow, [1]))
    e.add_request(EngineRequest("other", toks(2, 2 * PS), [1]))
    assert pf.started == {"waits": 8, "other": 0}
    pf.ready["waits"] = None
    first = e.step()
    assert [rid for rid, _ in first.scheduled] == ["other"]  # not blocked behind "waits"
    pf.ready["waits"] = 5  # the prefetch stopped with 5 of its 8 pages
    second = e.step()
    assert second.scheduled == [("waits", CachedTokens(storage=5 * PS))]


def _queue_order(priority_scheduling: bool) -> list[str]:
    """The admission order of requests queued behind one that holds the only batch slot."""
    e = Engine(
        EngineConfig(
            page_size=PS, max_running_requests=1, enable_priority_scheduling=priority_scheduling
        )
    )
    e.add_request(EngineRequest("running", toks(0, 64), toks(9, 4)))
    e.step()
    for rid, p in (("a", 0), ("b", 1), ("c", 0), ("d", 5), ("e", 1)):
        e.add_request(EngineRequest(rid, toks(len(rid) + ord(rid), 64), [1], priority=p))
    return [rid for r in run(e) for rid, _ in r.scheduled]


def test_priority_scheduling_takes_higher_priorities_first_then_arrival() -> None:
    # SGLang's --enable-priority-scheduling: higher values first, FCFS within one priority
    assert _queue_order(True) == ["d", "b", "e", "a", "c"]


def test_without_priority_scheduling_a_priority_changes_nothing() -> None:
    assert _queue_order(False) == ["a", "b", "c", "d", "e"]


def test_a_higher_priority_head_is_tried_even_while_the_old_head_cannot_fit() -> None:
    # 20 pages: the running request holds 13, the big waiting one needs 13 and is blocked; a
    # small follow-up asking priority 1 fits beside the running one and must not wait for it
    e = Engine(
        EngineConfig(
            page_size=PS, gpu_kv_tokens=20 * PS, max_running_requests=8,
            enable_priority_scheduling=True,
        )
    )  # fmt: skip
    e.add_request(EngineRequest("running", toks(0, 10 * PS), toks(9, 3 * PS)))
    e.add_request(EngineRequest("big", toks(1, 10 * PS), toks(9, 3 * PS)))
    assert [rid for rid, _ in e.step().scheduled] == ["running"]
    e.step()  # "big" stays blocked
    e.add_request(EngineRequest("small", toks(2, 2 * PS), [1], priority=1))
    assert [rid for rid, _ in e.step().scheduled] == ["small"]
