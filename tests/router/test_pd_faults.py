"""PD faults: the pair re-chosen before the first byte, clean stream errors, no hangs."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import aiohttp
import orjson

from tests.helpers.polling import eventually
from tests.router.conftest import MakeRouter, MakeWorker
from tests.router.test_pd import CHAT, Pd, start_pd


def all_released(pd: Pd) -> bool:
    return all((w.inflight, w.tokens) == (0, 0) for w in pd.router.state.registry.workers.values())


async def post(
    pd: Pd, body: Mapping[str, object], path: str = "/v1/chat/completions"
) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as s, s.post(pd.url + path, json=body) as resp:
        return resp.status, dict(resp.headers), await resp.read()


async def metrics(pd: Pd) -> str:
    async with aiohttp.ClientSession() as s, s.get(pd.url + "/metrics") as resp:
        return await resp.text()


async def test_refused_prefill_is_replaced_before_the_first_byte(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    pd = await start_pd(make_worker, make_router)
    dead, alive = pd.prefills
    dead_url = dead.url
    await dead.close()  # still registered as healthy: the next pair with it is refused
    for _ in range(3):
        status, headers, _ = await post(pd, CHAT)
        assert status == 200 and headers["x-smetric-prefill-worker"] == alive.url
    assert f'smetric_retries_total{{worker="{dead_url}"}} 1.0' in await metrics(pd)
    assert not pd.worker(dead_url).healthy
    assert all_released(pd)


async def test_prefill_5xx_and_decode_5xx_are_retried_on_another_instance(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    pd = await start_pd(make_worker, make_router)
    # One side at a time: a failing attempt also consumes the other side's concurrent request.
    for failing in (pd.prefills[0], pd.decodes[0]):
        failing.fail_next = 1
        for _ in range(2):  # round-robin ties: the first instance is asked within two requests
            status, _, body = await post(pd, CHAT)
            assert status == 200 and orjson.loads(body)["choices"][0]["message"]["content"]
        assert failing.fail_next == 0
    m = await metrics(pd)
    for w in (pd.prefills[0], pd.decodes[0]):
        assert f'smetric_retries_total{{worker="{w.url}"}} 1.0' in m
        assert pd.worker(w.url).healthy  # a 5xx alone does not exclude
    assert all_released(pd)


async def test_refused_decode_is_replaced_and_its_prefill_request_closed(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    pd = await start_pd(make_worker, make_router, prefills=1)
    dead, alive = pd.decodes
    await dead.close()
    for _ in range(2):
        status, headers, _ = await post(pd, CHAT)
        assert status == 200 and headers["x-smetric-worker"] == alive.url
    # The prefill saw the attempt with the dead decode too, each with its own room.
    rooms = [b["bootstrap_room"] for b in pd.prefills[0].bodies]
    assert len(rooms) == len(set(rooms)) >= 2
    assert all_released(pd)


async def test_last_try_relays_the_decodes_own_error(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    pd = await start_pd(make_worker, make_router, prefills=1, decodes=1)
    pd.decodes[0].fail_next = 5
    status, headers, body = await post(pd, CHAT)
    assert status == 503 and orjson.loads(body)["error"]["message"] == "injected"  # OpenAI shape
    assert headers["x-smetric-worker"] == pd.decodes[0].url
    assert headers["x-smetric-prefill-worker"] == pd.prefills[0].url
    await pd.prefills[0].close()
    pd.decodes[0].fail_next = 0
    status, headers, body = await post(pd, CHAT)  # nothing left to try: a clear 502
    err = orjson.loads(body)["error"]
    assert status == 502 and err["code"] == "worker_unavailable" and "prefill" in err["message"]
    assert all_released(pd)


async def test_decode_lost_mid_stream_ends_with_an_error_event_then_done(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    pd = await start_pd(make_worker, make_router, prefills=1, decodes=1)
    pd.decodes[0].die_mid_stream_next = 1
    status, _, raw = await post(pd, {"text": "hello", "stream": True}, "/generate")
    assert status == 200
    events = raw.split(b"\n\n")
    assert events[0] == b'data: {"text":"a"}'
    assert orjson.loads(events[1][len(b"data: ") :])["error"]["code"] == "worker_lost"
    assert events[2:] == [b"data: [DONE]", b""]
    await eventually(lambda: all_released(pd), "every pair released")


async def test_prefill_that_never_hands_over_ends_in_the_decodes_error(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    # The decode gives up waiting for the KV (the worker's own timeout) and says so.
    pd = await start_pd(make_worker, make_router, prefills=1, decodes=1, kv_timeout=0.2)
    pd.prefills[0].never_hand_over = True
    status, headers, body = await post(pd, CHAT)
    assert status == 500 and "timed out" in orjson.loads(body)["error"]["message"]
    assert headers["x-smetric-prefill-worker"] == pd.prefills[0].url
    assert all_released(pd)


async def test_router_bounds_the_handover_when_the_decode_waits_forever(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    pd = await start_pd(
        make_worker, make_router, prefills=1, decodes=1, pd_handover_timeout_secs=0.3
    )
    pd.prefills[0].never_hand_over = True
    for body in (CHAT, {**CHAT, "stream": True}):
        status, headers, raw = await post(pd, body)
        assert status == 504 and orjson.loads(raw)["error"]["code"] == "prefill_timeout"
        assert headers["x-smetric-prefill-worker"] == pd.prefills[0].url
    assert all_released(pd)


async def test_client_leaving_releases_both_sides(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    pd = await start_pd(make_worker, make_router, prefills=1, decodes=1)
    prefill = pd.prefills[0]
    prefill.stall = True
    async with aiohttp.ClientSession() as s:
        task = asyncio.create_task(s.post(pd.url + "/v1/chat/completions", json=CHAT))
        await eventually(
            lambda: pd.worker(prefill.url).tokens > 0, "the prefill counting the request's tokens"
        )
        task.cancel()
    await eventually(lambda: all_released(pd), "every pair released")
    prefill.stall = False
    prefill.release.set()
    status, _, _ = await post(pd, CHAT)
    assert status == 200


async def test_a_failing_prefill_opens_its_circuit_and_gets_no_more_requests(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    # round_robin: the same prompt again would go to the prefill that cached it under smetric
    pd = await start_pd(
        make_worker,
        make_router,
        cb_failure_threshold=2,
        cb_timeout_duration_secs=600,
        prefill_policy="round_robin",
    )
    failing, working = pd.prefills
    failing.fail_next = 10**6  # 503 to every request
    served = 0
    while len(failing.bodies) < 2:  # each failure is retried on the other prefill
        status, headers, _ = await post(pd, CHAT)
        assert status == 200 and headers["x-smetric-prefill-worker"] == working.url
        served += 1
        assert served < 10, "the failing prefill was never chosen"
    async with aiohttp.ClientSession() as s, s.get(pd.url + "/workers") as r:
        circuits = {w["url"]: w["circuit"]["state"] for w in (await r.json())["workers"]}
    assert circuits[failing.url] == "open"
    assert {circuits[w.url] for w in (working, *pd.decodes)} == {"closed"}
    for _ in range(4):  # open: not chosen, not even tried
        status, headers, _ = await post(pd, CHAT)
        assert status == 200 and headers["x-smetric-prefill-worker"] == working.url
    assert len(failing.bodies) == 2
    assert pd.worker(failing.url).healthy  # the circuit, not the health check, keeps it out
    assert all_released(pd)


async def test_decode_streams_cut_mid_way_open_the_decodes_circuit(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    # The client gets a 200 and an error event: only the router sees that the decode failed.
    pd = await start_pd(
        make_worker, make_router, prefills=1, decodes=1, cb_failure_threshold=2,
        cb_timeout_duration_secs=600,
    )  # fmt: skip
    decode, prefill = pd.decodes[0], pd.prefills[0]
    decode.die_mid_stream_next = 2
    for _ in range(2):
        status, _, raw = await post(pd, {"text": "hello", "stream": True}, "/generate")
        assert status == 200 and b"worker_lost" in raw
    async with aiohttp.ClientSession() as s, s.get(pd.url + "/workers") as r:
        circuits = {w["url"]: w["circuit"]["state"] for w in (await r.json())["workers"]}
    assert circuits == {decode.url: "open", prefill.url: "closed"}
    await eventually(lambda: all_released(pd), "every pair released")
