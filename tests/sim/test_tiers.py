"""The tier modes and the global tier's costs (sim/tiers.py): sizes, the server link FIFO, the
network share, the per-fetch overhead, write-through and HiCache's prefetch policies."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from smetric_router.core.decay import RECENT_HALF_LIFE_S
from smetric_router.engine.global_tier import GlobalTier
from smetric_router.engine.timing import TimingModel
from smetric_router.policies import make_policy
from smetric_router.sim import cluster
from smetric_router.sim.__main__ import main
from smetric_router.sim.config import SimConfig
from smetric_router.sim.tiers import Tiers, prefetch_timeout_s
from smetric_router.traces.loaders import with_carried_history
from smetric_router.traces.schema import TraceRequest
from tests.helpers.policies import ViewRecorder
from tests.sim.test_sim import _write

TIMING = TimingModel.load("h20-qwen3-coder-30b-a3b")
KVB = TIMING.kv_bytes_per_token
PS = 16
GPU = 4096 * PS
HOST = 3 * GPU


def _cfg(**kw: Any) -> SimConfig:
    base: dict[str, Any] = {
        "instances": 2,
        "gpus_per_server": 8,
        "gpu_kv_tokens": GPU,
        "host_kv_tokens": HOST,
        "network_fraction": 1.0,
        "fetch_overhead_s": 0.0,
        "nic_bytes_per_s": 10e9,
    }
    base.update(kw)
    return SimConfig(**base)


# ---- sizes --------------------------------------------------------------------------------------


def test_paper_mode_has_no_host_tier_and_sizes_the_global_tier_on_gpu_kv() -> None:
    cfg = SimConfig(instances=4, gpu_kv_tokens=GPU, host_kv_tokens=HOST)
    assert cfg.tier_mode == "paper"
    ecfg, tier = cluster.engine_setup(cfg, TIMING, 1.5)
    assert ecfg.host_kv_tokens == 0
    assert tier is not None and tier.capacity_pages == 1.5 * 4 * GPU // PS


def test_hicache_mode_keeps_the_host_tier_and_the_same_global_size() -> None:
    cfg = SimConfig(instances=4, gpu_kv_tokens=GPU, host_kv_tokens=HOST, tier_mode="hicache")
    ecfg, tier = cluster.engine_setup(cfg, TIMING, 1.5)
    assert ecfg.host_kv_tokens == HOST
    assert tier is not None and tier.capacity_pages == 1.5 * 4 * GPU // PS


def test_bad_tier_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        SimConfig(tier_mode="lmcache")
    with pytest.raises(ValueError):
        SimConfig(prefetch_policy="eager")
    with pytest.raises(ValueError):
        SimConfig(network_fraction=1.5)


# ---- the server link ----------------------------------------------------------------------------


def _fetch_seconds(cfg: SimConfig, tokens: int, instances: tuple[int, ...]) -> list[float]:
    """Paper mode: the stall of a fetch of `tokens` by each of `instances`, all at t = 0."""
    tiers = Tiers(cfg, TIMING, math.inf)
    engines = [tiers.engine(i) for i in range(cfg.instances)]
    return [engines[i].storage_fetch_seconds(tokens) for i in instances]


def test_two_instances_of_one_server_queue_on_its_link() -> None:
    tokens = 8192
    first, second = _fetch_seconds(_cfg(), tokens, (0, 1))
    wire = tokens * KVB / 10e9
    pcie = TIMING.host_load_seconds(tokens)
    assert first == pytest.approx(wire + pcie)
    assert second == pytest.approx(2 * wire + pcie)  # waits for the first transfer


def test_instances_of_different_servers_do_not_queue() -> None:
    cfg = _cfg(instances=2, gpus_per_server=1)
    first, second = _fetch_seconds(cfg, 8192, (0, 1))
    assert first == pytest.approx(second)


def test_more_nics_per_server_fetch_faster() -> None:
    tokens = 8192
    pcie = TIMING.host_load_seconds(tokens)
    one = _fetch_seconds(_cfg(), tokens, (0,))[0]
    two = _fetch_seconds(_cfg(nics_per_server=2), tokens, (0,))[0]
    assert two - pcie == pytest.approx((one - pcie) / 2)
    assert _cfg(nics_per_server=4).server_link_bytes_per_s == 40e9


def test_network_fraction_is_derived_from_the_servers_and_scales_the_wire_time() -> None:
    assert SimConfig(instances=32, gpus_per_server=8).net_fraction == 0.75
    assert SimConfig(instances=8, gpus_per_server=8).net_fraction == 0.0
    tokens = 8192
    wire = tokens * KVB / 10e9
    pcie = TIMING.host_load_seconds(tokens)
    half = _cfg(instances=16, network_fraction=None)  # two servers: half the bytes cross
    assert _fetch_seconds(half, tokens, (0,))[0] == pytest.approx(0.5 * wire + pcie)
    local = _cfg(network_fraction=0.0)  # one server: PCIe only
    assert _fetch_seconds(local, tokens, (0,))[0] == pytest.approx(pcie)


def test_every_fetch_pays_the_fixed_overhead() -> None:
    tokens = 4096
    plain = _fetch_seconds(_cfg(), tokens, (0,))[0]
    slow = _fetch_seconds(_cfg(fetch_overhead_s=2e-3), tokens, (0,))[0]
    assert slow - plain == pytest.approx(2e-3)


# ---- write-through ------------------------------------------------------------------------------


@pytest.mark.parametrize("capacity", [math.inf, 10 * PS])
def test_a_stored_page_is_not_readable_before_its_write_completes(capacity: float) -> None:
    tier = GlobalTier(capacity, page_size=PS)
    tier.store([1, 2], ready_at=5.0)
    tier.store([3], ready_at=7.0)
    assert tier.peek([1, 2, 3], now=4.9) == 0
    assert tier.peek([1, 2, 3], now=5.0) == 2
    assert tier.lookup([1, 2, 3], now=7.0) == 3
    assert tier.peek([1, 2, 3]) == 3  # no time given: everything stored counts
    assert tier.missing([3, 4, 4, 5]) == [4, 5]


def test_readable_is_what_the_latest_query_could_read_and_moves_nothing() -> None:
    tier = GlobalTier(3 * PS, page_size=PS)
    tier.store([1, 2], ready_at=5.0)
    tier.store([3], ready_at=7.0)
    assert tier.readable([1, 2, 3]) == 0  # no query has reached 5 s yet
    assert tier.peek([9], now=6.0) == 0
    assert tier.readable([1, 2, 3]) == 2  # 3 is still being written at 6 s
    assert tier.readable([2, 3]) == 1
    tier.store([4], ready_at=0.0)  # evicts the least recent: readable() did not touch 1
    assert tier.readable([1]) == 0


def test_write_through_queues_on_the_link_and_is_readable_only_after_it() -> None:
    cfg = _cfg()
    tiers = Tiers(cfg, TIMING, math.inf)
    tiers.engine(0)
    tiers.engine(1)
    writer, reader = tiers.ports
    pages = list(range(100, 164))  # 64 pages = 1024 tokens
    write_s = len(pages) * PS * KVB / 10e9
    writer.store(pages)
    writer.store(pages[:8])  # already pending: sent once
    assert tiers.tier is not None and tiers.tier.peek(pages) == 0  # nothing sent mid-step
    writer.flush(1.0, 1.0 + write_s / 2)  # the step that made them: [1, 1 + write_s / 2)
    assert tiers.stats.write_bytes == len(pages) * PS * KVB
    reader.now = 1.0 + write_s * 0.99
    assert reader.peek(pages) == 0
    reader.now = 1.0 + write_s
    assert reader.peek(pages) == len(pages)
    writer.store(pages)  # already on the tier: nothing to send
    writer.flush(2.0, 2.5)
    assert tiers.stats.write_bytes == len(pages) * PS * KVB
    # a long step: its pages are readable when it ends, even if sent earlier
    writer.store([7, 8])
    writer.flush(3.0, 9.0)
    reader.now = 8.9
    assert reader.peek([7, 8]) == 0
    reader.now = 9.0
    assert reader.peek([7, 8]) == 2


def test_a_fetch_behind_a_write_waits_for_it() -> None:
    tiers = Tiers(_cfg(), TIMING, math.inf)
    e0, e1 = tiers.engine(0), tiers.engine(1)
    writer, reader = tiers.ports
    pages = list(range(64))
    writer.store(pages)
    writer.flush(0.0, 0.5)
    write_s = len(pages) * PS * KVB / 10e9
    tokens = 2048
    reader.now = 0.0
    stall = e1.storage_fetch_seconds(tokens)
    assert stall == pytest.approx(write_s + tokens * KVB / 10e9 + TIMING.host_load_seconds(tokens))
    assert e0 is not e1


# ---- HiCache prefetch ---------------------------------------------------------------------------


def _prefetch(policy: str, pages: int, rate: float = 10e9) -> tuple[Tiers, float]:
    """A prefetch of `pages` started at t = 0 on instance 0: its tiers and transfer seconds."""
    cfg = _cfg(tier_mode="hicache", prefetch_policy=policy, nic_bytes_per_s=rate)
    tiers = Tiers(cfg, TIMING, math.inf)
    tiers.engine(0)
    tiers.ports[0].now = 0.0
    tiers.prefetchers[0].start("r", pages)
    return tiers, pages * PS * KVB / rate


def _poll(tiers: Tiers, t: float) -> int | None:
    tiers.ports[0].now = t
    return tiers.prefetchers[0].poll("r")


def test_best_effort_takes_the_pages_that_arrived() -> None:
    tiers, seconds = _prefetch("best_effort", 100)
    assert _poll(tiers, seconds * 0.5) == 50
    assert tiers.stats.fetch_bytes == 50 * PS * KVB
    assert tiers.links[0].free_at == pytest.approx(seconds * 0.5)  # the rest was cancelled


def test_wait_complete_waits_for_every_page() -> None:
    tiers, seconds = _prefetch("wait_complete", 100)
    assert _poll(tiers, seconds * 0.5) is None
    assert tiers.prefetchers[0].next_ready(seconds * 0.5) == pytest.approx(seconds)
    assert _poll(tiers, seconds) == 100


def test_timeout_waits_at_most_sglangs_timeout_from_the_first_blocked_poll() -> None:
    pages = 640  # 10240 tokens: 1 s + 0.25 s x 10 = 3.5 s
    assert prefetch_timeout_s(pages * PS) == pytest.approx(3.5)
    tiers, seconds = _prefetch("timeout", pages, rate=0.1e9)  # a slow link: ~10 s
    assert seconds > 5
    assert _poll(tiers, 1.0) is None  # starts the clock
    assert tiers.prefetchers[0].next_ready(1.0) == pytest.approx(4.5)
    assert _poll(tiers, 4.4) is None
    got = _poll(tiers, 4.5)
    assert got == int(pages * 4.5 / seconds)
    # a prefetch that completes before the timeout is taken whole when it completes
    tiers, seconds = _prefetch("timeout", 64)
    assert _poll(tiers, seconds / 2) is None
    assert _poll(tiers, seconds) == 64


def test_short_prefetches_are_not_started() -> None:
    tiers, _ = _prefetch("wait_complete", 255 // PS)  # below SGLang's 256-token threshold
    assert _poll(tiers, 0.0) == 0
    assert tiers.links[0].busy_s == 0.0


# ---- whole runs ---------------------------------------------------------------------------------


def _trace(sessions: int, turns: int) -> list[TraceRequest]:
    out = []
    for s in range(sessions):
        blocks: tuple[int, ...] = (0, 1, 2, 3)
        for k in range(turns):
            blocks = blocks + tuple(1000 * (s + 1) + 40 * k + j for j in range(40))
            out.append(
                TraceRequest(
                    req_id=f"s{s}t{k}",
                    arrival_s=s * 0.05 + k * 3.0,
                    session=f"s{s}",
                    parent=f"s{s}t{k - 1}" if k else None,
                    turn=k,
                    input_len=len(blocks) * PS - 3,
                    output_len=30,
                    block_ids=blocks,
                    block_size=PS,
                )
            )
    return with_carried_history(out)


@pytest.mark.parametrize("policy", ["best_effort", "wait_complete", "timeout"])
def test_hicache_runs_finish_every_request_and_only_fetched_pages_count(policy: str) -> None:
    # round robin moves every follow-up, and a slow link makes prefetches wait
    cfg = SimConfig(
        instances=3,
        gpu_kv_tokens=1 << 16,
        host_kv_tokens=1 << 16,
        tier_mode="hicache",
        prefetch_policy=policy,
        nic_bytes_per_s=2e9,
        network_fraction=1.0,
    )
    c = cluster.Cluster(cfg, make_policy("round_robin"), math.inf)
    res = c.run(_trace(4, 3))  # 4 sessions over 3 instances: every follow-up moves
    assert all(r.finish >= 0 for r in res.records)
    assert sum(r.cached_global for r in res.records) * KVB == res.global_fetch_bytes
    if policy != "best_effort":  # best effort may take nothing if admitted at once
        assert res.global_fetch_bytes > 0


def test_rows_carry_windows_that_sum_to_the_tokens_computed() -> None:
    from smetric_router.sim.metrics import summarize

    cfg = SimConfig(instances=3, gpu_kv_tokens=1 << 16, window_s=2.0, network_fraction=1.0)
    c = cluster.Cluster(cfg, make_policy("round_robin"), 1.0)
    res = c.run(_trace(4, 3))
    row = summarize(res, cfg.slo, "round_robin", 1.0, 1.0)
    computed = sum(i.engine.prefill_tokens_computed for i in c.instances)
    decoded = sum(r.output_len for r in res.records if r.first_token >= 0)
    windows = row["windows"]
    assert row["tier_mode"] == "paper" and row["window_s"] == 2.0
    assert len(windows) > 3 and all(len(w) == 3 for w in windows)
    assert all(isinstance(v, int) for w in windows for v in w)
    assert sum(map(sum, windows)) == computed + decoded
    assert row["global_write_bytes"] > 0 and row["global_fetch_bytes"] > 0
    assert 0 < row["link_busy_share"] < 1


def test_paper_mode_fetch_stalls_the_admitting_batch() -> None:
    def follow_up_ttft(rate: float) -> float:
        cfg = SimConfig(
            instances=3, gpu_kv_tokens=1 << 16, network_fraction=1.0, nic_bytes_per_s=rate
        )
        res = cluster.Cluster(cfg, make_policy("round_robin"), math.inf).run(_trace(4, 3))
        moved = [r for r in res.records if r.cached_global > 0]
        assert moved
        return sum(r.first_token - r.arrival for r in moved) / len(moved)

    fast, slow = follow_up_ttft(100e9), follow_up_ttft(0.2e9)
    # ~700 tokens x 96 KiB per follow-up: ~0.34 s more on a 0.2 GB/s link
    assert slow - fast > 0.2


def test_cli_tier_flags_reach_the_rows(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    _write(trace, _trace(4, 2))
    out = tmp_path / "o.json"
    argv = ["--trace", str(trace), "--instances", "3", "--policies", "round_robin"]
    argv += ["--global-ratio", "1", "--tier-mode", "hicache", "--prefetch-policy", "wait_complete"]
    argv += ["--nics-per-server", "2", "--nic-gbytes-per-s", "5", "--fetch-overhead-ms", "2"]
    assert main([*argv, "--json", str(out)]) == 0
    row = json.loads(out.read_text())["results"][0]
    assert row["tier_mode"] == "hicache"
    assert row["windows"] and {"global_fetch_bytes", "link_busy_share"} <= row.keys()
    assert main([*argv, "--nics-per-server", "0"]) == 2


def _recorder() -> ViewRecorder:
    return ViewRecorder(make_policy("round_robin"))


def _seen(rec: ViewRecorder) -> list[tuple[int, int]]:
    """Every (hit, gpu_hit) the policy was shown, worker by worker, decision by decision."""
    return [(w.hit, w.gpu_hit) for view in rec.views for w in view.workers]


@pytest.mark.parametrize("ratio", [0.0, math.inf])
def test_the_policies_see_what_the_global_tier_holds_as_the_router_would(ratio: float) -> None:
    # one GPU that holds ~1.5 prompts: the follow-ups' histories are gone from it by the time
    # they come back, and with a global tier the master still holds them
    cfg = SimConfig(instances=2, gpu_kv_tokens=1200, tier_mode="paper")
    rec = _recorder()
    cluster.Cluster(cfg, rec, ratio).run(_trace(4, 3))
    l3s = [w.l3_hit for view in rec.views for w in view.workers]
    assert len(l3s) == 2 * 12
    pairs = list(zip(l3s[::2], l3s[1::2], strict=True))
    assert all(a == b for a, b in pairs)  # one store: the same figure for every worker
    if ratio == 0:
        assert set(l3s) == {0}
    else:
        assert any(l3 and l3 > hit for l3, (hit, _) in zip(l3s, _seen(rec), strict=True))


def test_the_policies_see_the_new_tokens_sent_to_each_instance_lately() -> None:
    # three unrelated first turns, one half-life apart, round robin over two instances
    reqs = [
        TraceRequest(
            req_id=f"r{k}", arrival_s=k * RECENT_HALF_LIFE_S, session=f"s{k}", parent=None,
            turn=0, input_len=64 * PS, output_len=4,
            block_ids=tuple(range(1000 * k, 1000 * k + 64)), block_size=PS,
        )
        for k in range(3)
    ]  # fmt: skip
    rec = _recorder()
    cluster.Cluster(SimConfig(instances=2), rec, 0.0).run(with_carried_history(reqs))
    half, quarter = pytest.approx(64 * PS / 2), pytest.approx(64 * PS / 4)
    recent = [tuple(w.recent_tokens for w in view.workers) for view in rec.views]
    assert recent == [(0.0, 0.0), (half, 0.0), (quarter, half)]


@pytest.mark.parametrize("tier_mode", ["paper", "hicache"])
def test_the_policies_hit_is_the_local_tier_of_the_mode(tier_mode: str) -> None:
    # one instance whose GPU holds ~1.5 prompts: older sessions' pages go to the host tier,
    # where only hicache keeps them (and the policies see them as local hits)
    cfg = SimConfig(instances=1, gpu_kv_tokens=1200, host_kv_tokens=1 << 16, tier_mode=tier_mode)
    rec = _recorder()
    cluster.Cluster(cfg, rec, 0.0).run(_trace(4, 3))
    seen = _seen(rec)
    assert seen
    if tier_mode == "paper":
        assert all(hit == gpu for hit, gpu in seen)
    else:
        assert any(hit > gpu for hit, gpu in seen)
