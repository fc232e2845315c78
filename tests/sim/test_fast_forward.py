"""Engine.step_many fast-forward gives the same timeline as single steps; token-free requests."""

from __future__ import annotations

import math
import random

import pytest

from smetric_router.engine.api import EngineConfig, EngineRequest
from smetric_router.engine.engine import Engine

PS = 16


def _requests(n: int, seed: int) -> list[tuple[float, EngineRequest]]:
    rng = random.Random(seed)
    out = []
    t = 0.0
    for i in range(n):
        t += rng.expovariate(4.0)
        n_in, n_out = rng.randint(20, 3000), rng.randint(1, 400)
        shared = rng.randint(0, n_in // PS)  # a prefix shared by every request
        hashes = list(range(shared)) + [hash((i, j)) for j in range(shared, (n_in + n_out) // PS)]
        out.append((t, EngineRequest(f"r{i}", [], [], hashes, n_in, n_out)))
    return out


def _run(fast: bool, seed: int) -> tuple[dict[str, float], dict[str, float], int, list[float]]:
    cfg = EngineConfig(gpu_kv_tokens=60_000, max_running_requests=24, chunked_prefill_size=2048)
    eng = Engine(cfg)
    arrivals = _requests(120, seed)
    first: dict[str, float] = {}
    done: dict[str, float] = {}
    t, i, calls = 0.0, 0, 0
    throughput: list[float] = []  # gen_throughput seen at every third arrival
    while i < len(arrivals) or eng.has_work():
        while i < len(arrivals) and arrivals[i][0] <= t:
            if i % 3 == 0:
                throughput.append(eng.load().gen_throughput)
            eng.add_request(arrivals[i][1])
            i += 1
        if not eng.has_work():
            t = arrivals[i][0]
            continue
        until = arrivals[i][0] - t if i < len(arrivals) else math.inf
        res = eng.step_many(10**9, until) if fast else eng.step()
        calls += 1
        t += res.duration
        for rid, _ in res.emitted:
            first.setdefault(rid, t)
        for rid in res.finished:
            done[rid] = t
    return first, done, calls, throughput


@pytest.mark.parametrize("seed", [1, 2])
def test_step_many_matches_single_steps(seed: int) -> None:
    first_a, done_a, calls_a, tput_a = _run(False, seed)
    first_b, done_b, calls_b, tput_b = _run(True, seed)
    assert done_a.keys() == done_b.keys() and len(done_a) == 120
    for rid in done_a:
        assert done_b[rid] == pytest.approx(done_a[rid], rel=1e-9)
        assert first_b[rid] == pytest.approx(first_a[rid], rel=1e-9)
    assert calls_b < calls_a / 3  # the point of it
    assert tput_b == pytest.approx(tput_a, rel=1e-9) and max(tput_a) > 0


def test_step_many_stops_at_the_first_step_reaching_until() -> None:
    eng = Engine(EngineConfig())
    eng.add_request(EngineRequest("a", [], [], list(range(20)), 20, 300))
    while eng.decode_only_steps() == 0:
        eng.step()
    one = eng.decode_run_seconds(1)
    res = eng.step_many(1000, until_seconds=2.5 * one)
    assert res.steps == 3  # steps end at ~1, ~2, ~3 step times: the third reaches 2.5
    assert res.emitted == [("a", 3)]


def test_token_free_request_hits_its_shared_prefix() -> None:
    eng = Engine(EngineConfig())
    eng.add_request(EngineRequest("a", [], [], list(range(10)), 160, 5))
    while eng.has_work():
        eng.step()
    eng.add_request(EngineRequest("b", [], [], [*range(8), 99, 98], 161, 1))
    res = eng.step()
    assert res.scheduled[0][1].device == 8 * PS


def test_token_free_request_needs_a_hash_per_full_page() -> None:
    with pytest.raises(ValueError, match="page hashes"):
        Engine(EngineConfig()).add_request(EngineRequest("a", [], [], [1], 40, 0))


@pytest.mark.parametrize("host", [0, 4_000, 12_000])
def test_match_len_agrees_with_match_under_eviction(host: int) -> None:
    # small GPU and host tiers so that both evict while the requests run; a host tier smaller
    # and larger than the GPU tier take match_len's two paths
    cfg = EngineConfig(gpu_kv_tokens=8_000, host_kv_tokens=host, max_running_requests=8)
    eng = Engine(cfg)
    rng = random.Random(3)
    checked = 0
    for _, req in _requests(150, 5):
        eng.add_request(req)
        for _ in range(rng.randint(1, 30)):
            eng.step()
        probe = req.page_hashes or []
        for cut in (len(probe), len(probe) // 2, 3):
            on_gpu, on_host = eng.cache.match(probe[:cut])
            assert eng.cache.match_len(probe[:cut]) == (len(on_gpu), len(on_host))
            checked += bool(on_gpu or on_host)
    assert checked > 50
