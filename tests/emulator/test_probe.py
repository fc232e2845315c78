"""POST /smetric/prefix_match: the patched SGLang's read-only per-tier prefix probe."""

from __future__ import annotations

import time
from dataclasses import replace

from smetric_router.engine.api import EngineConfig
from tests.emulator.conftest import PAGE, Worker, make_config, serving


async def _generate(worker: Worker, ids: list[int]) -> None:
    status, _ = await worker.post(
        "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 2}}
    )
    assert status == 200


async def test_probe_reports_the_page_aligned_cached_prefix(worker: Worker) -> None:
    prompt = list(range(1, 41))  # 40 tokens: 2 full pages of 16
    status, cold = await worker.post("/smetric/prefix_match", {"input_ids": [prompt]})
    assert status == 200
    assert cold == {"page_size": PAGE, "results": [{"device": 0, "host": 0}]}

    await _generate(worker, prompt)
    other = [*prompt[:20], *range(500, 540)]  # shares one full page, diverges inside the second
    status, warm = await worker.post("/smetric/prefix_match", {"input_ids": [prompt, other, []]})
    assert status == 200
    assert warm["results"] == [
        {"device": 32, "host": 32},
        {"device": 16, "host": 16},
        {"device": 0, "host": 0},
    ]
    # A flat list is one prompt; asking again gives the same answer (nothing moved).
    for _ in range(2):
        status, flat = await worker.post("/smetric/prefix_match", {"input_ids": prompt})
        assert (status, flat["results"]) == (200, [{"device": 32, "host": 32}])


async def test_probe_counts_host_tier_pages_in_host_only() -> None:
    # 6 GPU pages: a second prompt of 3 full pages pushes some of the first one's to the host.
    engine = EngineConfig(page_size=PAGE, gpu_kv_tokens=6 * PAGE, host_kv_tokens=64 * PAGE)
    async with serving(replace(make_config(), engine=engine)) as worker:
        first, second = list(range(1, 4 * PAGE)), list(range(1000, 1000 + 4 * PAGE - 1))
        await _generate(worker, first)
        await _generate(worker, second)
        _, body = await worker.post("/smetric/prefix_match", {"input_ids": [first, second]})
        (a, b) = body["results"]
        assert 0 < a["device"] < a["host"] == 3 * PAGE, a
        assert b == {"device": 3 * PAGE, "host": 3 * PAGE}


async def test_probe_rejects_malformed_bodies(worker: Worker) -> None:
    for body in ({}, {"input_ids": "abc"}, {"input_ids": [[1, 2], "x"]}, {"input_ids": [1.5]}):
        status, reply = await worker.post("/smetric/prefix_match", body)
        assert status == 400, body
        assert "input_ids" in reply["error"]["message"]


async def test_probe_delay_fault_holds_the_answer(worker: Worker) -> None:
    status, faults = await worker.post("/emulator/faults", {"probe_delay_secs": 0.2})
    assert status == 200 and faults["probe_delay_secs"] == 0.2
    start = time.monotonic()
    status, _ = await worker.post("/smetric/prefix_match", {"input_ids": [1, 2, 3]})
    assert status == 200 and time.monotonic() - start >= 0.2
    status, reply = await worker.post("/emulator/faults", {"probe_delay_secs": -1})
    assert status == 400 and "probe_delay_secs" in reply["message"]
