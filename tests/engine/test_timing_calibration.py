"""The H20 profile against SGLang's measured Qwen3-30B-A3B figures (shared/reference/
h20-kernel-data/README.md), driven through the engine in the anchors' own settings."""

from __future__ import annotations

import pytest

from smetric_router.engine.api import EngineConfig, EngineRequest
from smetric_router.engine.engine import Engine
from smetric_router.engine.timing import TimingModel
from tests.shared_ref import require_shared

PROFILE = "h20-qwen3-coder-30b-a3b"
PREFILL_ANCHOR = 16_594  # tokens/GPU/s: 1 GPU, 16,384 max prefill tokens per step, input 4,096
DECODE_ANCHOR = 2_749  # tokens/GPU/s: batch 100 per GPU, input 4,096, output 2,048, TPOT ~38 ms
TOLERANCE = 0.15


def distinct(i: int, n: int) -> list[int]:
    return [(i * 7919 + j) % 150_000 for j in range(n)]


def test_prefill_throughput_within_15_percent() -> None:
    e = Engine(EngineConfig(chunked_prefill_size=16_384, max_running_requests=256, profile=PROFILE))
    n = 64
    for i in range(n):
        e.add_request(EngineRequest(f"r{i}", distinct(i, 4096), [1]))
    seconds = 0.0
    while e.has_work():
        seconds += e.step().duration
    tgs = n * 4096 / seconds
    assert tgs == pytest.approx(PREFILL_ANCHOR, rel=TOLERANCE)


def test_decode_throughput_within_15_percent() -> None:
    """The anchor ran 4 GPUs with DP attention and EP4 MoE: each GPU keeps its own 100 requests'
    attention and holds 32 of the 128 experts, computing its share of all 400 tokens' expert
    pairs (as many pairs as its own 100 tokens bring), plus a dispatch/combine all-to-all.
    ep_size=4 models one such GPU: the EP4 grouped-GEMM table and the all-to-all term."""
    timing = TimingModel.load(PROFILE, ep_size=4)
    cfg = EngineConfig(chunked_prefill_size=16_384, max_running_requests=100, gpu_kv_tokens=700_000)
    e = Engine(cfg, timing=timing)
    for i in range(100):
        e.add_request(EngineRequest(f"r{i}", distinct(i, 4096), distinct(1000 + i, 2048)))
    seconds, tokens, steps = 0.0, 0, 0
    while e.has_work():
        r = e.step()
        if len(r.emitted) == 100 and not r.scheduled:  # pure decode steps of the full batch
            seconds += r.duration
            tokens += 100
            steps += 1
    assert steps > 2000
    assert tokens / seconds == pytest.approx(DECODE_ANCHOR, rel=TOLERANCE)
    assert seconds / steps == pytest.approx(0.038, rel=TOLERANCE)  # TPOT


def test_single_gpu_decode_is_slower_than_the_ep4_anchor() -> None:
    """One GPU holds all 128 experts, so a decode step reads every expert's weights."""
    one = TimingModel.load(PROFILE)
    ep4 = TimingModel.load(PROFILE, ep_size=4)
    kv = 100 * 5120
    assert one.step_seconds([], 100, kv) > 1.3 * ep4.step_seconds([], 100, kv)


def test_h200_profile_is_faster_and_holds_more_kv() -> None:
    h20, h200 = TimingModel.load(PROFILE), TimingModel.load("h200-qwen3-coder-30b-a3b")
    assert h200.gpu_kv_tokens > 2 * h20.gpu_kv_tokens
    for prefill, n_dec, kv in (
        ([(0, 4096)] * 4, 0, 0),
        ([], 100, 512_000),
        ([(8000, 512)], 10, 50_000),
    ):
        assert h200.step_seconds(prefill, n_dec, kv) < h20.step_seconds(prefill, n_dec, kv)


def test_prefill_chunk_cost_grows_with_cached_context() -> None:
    t = TimingModel.load(PROFILE)
    assert t.step_seconds([(30_000, 2000)], 0, 0) > t.step_seconds([(0, 2000)], 0, 0)
    assert t.step_seconds([(0, 0)], 0, 0) == 0.0


def test_committed_profiles_are_what_build_profile_writes() -> None:
    import json

    from smetric_router.engine import build_profile as bp
    from smetric_router.engine.timing import PROFILES_DIR

    data = require_shared(bp.DEFAULT_DATA)
    for gpu in (bp.H20, bp.H200):
        built = json.loads(json.dumps(bp.build(data, gpu)))
        committed = json.loads((PROFILES_DIR / f"{built['name']}.json").read_text())
        assert built == committed
