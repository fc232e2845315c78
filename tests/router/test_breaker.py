"""Circuit breaking over HTTP: a holder answering 500 is opened, its follow-ups go elsewhere with
the reason breaker-open, and after the cool-down a probe that succeeds closes it again."""

from __future__ import annotations

from typing import Any

import aiohttp

from smetric_router.cluster.kv_index import KvIndex
from smetric_router.features.extract import FeatureExtractor
from tests.helpers.polling import eventually
from tests.router.conftest import MakeRouter, MakeWorker
from tests.router.test_policy_wiring import FOLLOW_UP, store
from tests.router.test_sticky_retry import chat

COOL_DOWN_S = 2.0  # long enough to send a request while it is open on a busy machine


async def circuit(url: str, worker: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(url + "/workers") as resp:
        workers = (await resp.json())["workers"]
    w = next(w for w in workers if w["url"] == worker)
    assert w["healthy"]  # the breaker is no health check: /health passes all along
    circuit: dict[str, Any] = w["circuit"]
    return circuit


async def metrics(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as resp:
        return await resp.text()


async def test_a_failing_holder_is_opened_then_probed_and_closed(
    make_worker: MakeWorker, make_router: MakeRouter, codec: Any
) -> None:
    workers = [await make_worker(n) for n in "abc"]
    holder = workers[1]
    features = FeatureExtractor(codec, page_size=16).from_chat(FOLLOW_UP)
    index = KvIndex()
    store(index, holder.url, list(features.page_hashes[: features.est_hit // 16]), 16)
    router = await make_router(
        [w.url for w in workers],
        hits=index,
        cb_failure_threshold=3,
        cb_success_threshold=2,
        cb_timeout_duration_secs=COOL_DOWN_S,
        # Only the index says who holds the history: else the retries' worker would hold it too
        # (in flight there) and the follow-up would stick to it, as it should.
        inflight_prefixes=False,
    )
    url, held = router.url, holder.url
    assert await chat(url) == (200, held, "sticky")
    assert (await circuit(url, held))["state"] == "closed"

    holder.fail_next, holder.fail_status = 3, 500
    for _ in range(3):  # each tries the holder, fails, and is retried elsewhere
        status, served, _ = await chat(url)
        assert status == 200 and served != held
    sent = len(holder.bodies)
    assert (await circuit(url, held))["state"] == "open"

    status, served, reason = await chat(url)
    assert (status, reason) == (200, "breaker-open") and served != held
    assert len(holder.bodies) == sent  # not even tried
    text = await metrics(url)
    assert f'smetric_breaker_state{{worker="{held}"}} 2.0' in text
    assert f'smetric_breaker_transitions_total{{to="open",worker="{held}"}} 1.0' in text
    assert f'smetric_decisions_total{{reason="breaker-open",worker="{served}"}} 1.0' in text

    async def half_open() -> bool:
        return bool((await circuit(url, held))["state"] == "half-open")

    await eventually(half_open, "the holder's circuit half-open after its cool-down")
    assert f'smetric_breaker_state{{worker="{held}"}} 1.0' in await metrics(url)
    # the probes are the session's own follow-ups, back on their holder
    assert await chat(url) == (200, held, "sticky")
    assert (await circuit(url, held))["state"] == "half-open"
    assert await chat(url) == (200, held, "sticky")
    assert (await circuit(url, held))["state"] == "closed"
    text = await metrics(url)
    assert f'smetric_breaker_state{{worker="{held}"}} 0.0' in text
    assert f'smetric_breaker_transitions_total{{to="closed",worker="{held}"}} 1.0' in text


async def test_client_errors_never_open_a_circuit(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    worker = await make_worker("a")
    router = await make_router([worker.url], cb_failure_threshold=2)
    body = {"model": "fake-model", "prompt": "hi", "max_tokens": 2}
    async with aiohttp.ClientSession() as s:
        for _ in range(4):
            worker.fail_next, worker.fail_status = 1, 400
            async with s.post(router.url + "/v1/completions", json=body) as resp:
                assert resp.status == 400
    assert (await circuit(router.url, worker.url))["state"] == "closed"


async def test_disabled_breaker_shows_no_circuit(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    worker = await make_worker("a")
    router = await make_router([worker.url], disable_circuit_breaker=True)
    async with aiohttp.ClientSession() as s, s.get(router.url + "/workers") as resp:
        assert "circuit" not in (await resp.json())["workers"][0]
    assert "smetric_breaker_state" not in await metrics(router.url)


async def test_streams_the_worker_broke_count_as_failures(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    worker = await make_worker("a")
    router = await make_router([worker.url], cb_failure_threshold=2)
    body = {"model": "fake-model", "prompt": "hi", "max_tokens": 2, "stream": True}
    async with aiohttp.ClientSession() as s:
        for expected in ("closed", "open"):
            worker.die_mid_stream_next = 1
            async with s.post(router.url + "/v1/completions", json=body) as resp:
                assert b"worker_lost" in await resp.read()
            assert (await circuit(router.url, worker.url))["state"] == expected
        async with s.post(router.url + "/v1/completions", json=body) as resp:
            assert resp.status == 503  # its only worker is open: refused at once
