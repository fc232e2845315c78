"""Health, discovery, load, metrics and cache-flush endpoints."""

from __future__ import annotations

import asyncio

import pytest

from smetric_router.emulator.__main__ import config_from_args, parse_args
from smetric_router.engine.engine import Engine
from tests.emulator.conftest import MODEL, PAGE, Worker
from tests.helpers.prometheus import value


async def test_health_and_ready(worker: Worker) -> None:
    for path in ("/health", "/health_generate", "/ready"):
        status, _ = await worker.get(path)
        assert status == 200, path
    # probes are not traffic
    _, metrics = await worker.get("/metrics")
    assert f'sglang:num_requests_total{{engine_type="unified",model_name="{MODEL}"' in metrics
    assert 'sglang:prompt_tokens_total{engine_type="unified"' in metrics
    assert value(metrics, "sglang:num_requests_total") == 0


async def test_server_info_says_emulated_and_describes_kv_events(worker: Worker) -> None:
    cfg = worker.config
    for path in ("/server_info", "/get_server_info"):
        status, info = await worker.get(path)
        assert status == 200
        assert info["emulated"] is True
        assert info["page_size"] == PAGE and info["dp_size"] == 1
        assert info["max_total_num_tokens"] == cfg.engine.gpu_kv_tokens
        assert info["kv_events"] == {
            "publisher": "zmq",
            "endpoint_host": "127.0.0.1",
            "endpoint_port_base": cfg.kv_events_port,
            "topic": "",
            "block_size": PAGE,
            "dp_size": 1,
            "replay_endpoint_port_base": cfg.kv_events_replay_port,
        }
    status, model = await worker.get("/model_info")
    assert status == 200 and model["emulated"] is True
    assert model["served_model_name"] == MODEL and model["is_generation"] is True
    assert model["tokenizer_path"] == cfg.tokenizer_path
    _, models = await worker.get("/v1/models")
    assert [m["id"] for m in models["data"]] == [MODEL]


async def test_loads_and_metrics_count_traffic(worker: Worker) -> None:
    body = {"input_ids": list(range(40)), "sampling_params": {"max_new_tokens": 5}}
    await worker.post("/generate", body)
    await worker.post("/generate", body)
    status, loads = await worker.get("/v1/loads")
    assert status == 200
    assert {"timestamp", "version", "accelerator", "num_accelerators"} <= set(loads)
    (entry,) = loads["loads"]
    assert entry["dp_rank"] == 0 and entry["num_running_reqs"] == 0
    assert entry["max_total_num_tokens"] == worker.config.engine.gpu_kv_tokens
    status, other = await worker.get("/v1/loads?dp_rank=1")
    assert (status, other["loads"]) == (200, [])  # SGLang: no such rank, no entry
    _, prom = await worker.get("/v1/loads?format=prometheus")
    assert 'sglang_num_running_reqs{dp_rank="0"} 0' in prom

    _, metrics = await worker.get("/metrics")
    assert value(metrics, "sglang:num_requests_total") == 2
    assert value(metrics, "sglang:prompt_tokens_total") == 80
    assert value(metrics, "sglang:generation_tokens_total") == 10
    # the second request hit two full pages
    assert value(metrics, "sglang:cached_tokens_total") == 32
    assert value(metrics, "sglang:num_running_reqs") == 0
    assert value(metrics, "sglang:page_size") == PAGE


async def test_flush_cache_clears_it_and_refuses_when_busy(worker: Worker) -> None:
    # 65 tokens: four full pages, and the last prompt token is always computed
    body = {"input_ids": list(range(65)), "sampling_params": {"max_new_tokens": 2}}
    await worker.post("/generate", body)
    _, hit = await worker.post("/generate", body)
    assert hit["meta_info"]["cached_tokens"] == 64
    async with worker.http.post(worker.url + "/flush_cache") as r:
        assert r.status == 200 and (await r.text()).startswith("Cache flushed")
    _, miss = await worker.post("/generate", body)
    assert miss["meta_info"]["cached_tokens"] == 0

    long = {"input_ids": [7] * 32, "stream": True, "sampling_params": {"max_new_tokens": 5000}}
    async with worker.http.post(worker.url + "/generate", json=long) as r:
        assert (await r.content.readline()).startswith(b"data: ")
        status, _ = await worker.get("/flush_cache")
        assert status == 400


async def test_clearing_a_storage_backend_it_does_not_have_is_refused(worker: Worker) -> None:
    async with worker.http.post(worker.url + "/hicache/storage-backend/clear") as r:
        assert r.status == 400


async def test_flush_waits_up_to_timeout_for_idle(worker: Worker) -> None:
    body = {"input_ids": [3] * 32, "sampling_params": {"max_new_tokens": 40}}
    pending = asyncio.ensure_future(worker.post("/generate", body))
    while True:  # until the request runs
        _, loads = await worker.get("/v1/loads")
        if loads["loads"][0]["num_running_reqs"]:
            break
    async with worker.http.post(worker.url + "/flush_cache?timeout=30") as r:
        assert r.status == 200  # the engine was busy: the flush waited for it to go idle
    status, out = await pending
    assert status == 200 and out["meta_info"]["finish_reason"]["type"] == "length"
    _, again = await worker.post("/generate", {**body, "input_ids": [3] * 33})
    assert again["meta_info"]["cached_tokens"] == 0


def test_cli_help_says_it_is_an_emulator(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    assert "emulated SGLang worker" in capsys.readouterr().out
    cfg = config_from_args(parse_args(["--port", "1234", "--page-size", "32", "--speedup", "5",
                                       "--kv-events-port", "9000"]))  # fmt: skip
    assert cfg.port == 1234 and cfg.engine.page_size == 32 and cfg.speedup == 5
    assert cfg.kv_events_endpoint == "tcp://127.0.0.1:9000"
    with pytest.raises(SystemExit):
        parse_args(["--kv-events-replay-port", "9001"])


async def test_engine_failure_fails_requests_and_health(worker: Worker) -> None:
    def broken(self: Engine) -> None:
        raise RuntimeError("boom")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Engine, "step", broken)
        status, out = await worker.post("/generate", {"text": "x"})
    assert status == 200 and out["meta_info"]["finish_reason"]["type"] == "abort"
    assert "boom" in out["meta_info"]["finish_reason"]["message"]
    assert (await worker.get("/health"))[0] == 503
    assert (await worker.get("/ready"))[0] == 503
    assert (await worker.post("/generate", {"text": "x"}))[0] == 503
