"""Fault injection (POST /emulator/faults) and what a client going away does to its request."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.emulator.conftest import MODEL, Worker
from tests.helpers.polling import eventually

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def _running(worker: Worker) -> int:
    _, loads = await worker.get("/v1/loads")
    return int(loads["loads"][0]["num_running_reqs"] + loads["loads"][0]["num_waiting_reqs"])


async def _until_idle(worker: Worker) -> None:
    async def idle() -> bool:
        return not await _running(worker)

    await eventually(idle, "the engine letting go of the request")


async def test_no_fault_is_armed_by_default(worker: Worker) -> None:
    status, state = await worker.get("/emulator/faults")
    assert status == 200
    assert state == {
        "fail_next": 0,
        "status": 503,
        "die_mid_stream_next": 0,
        "stall": False,
        "withhold_kv_next": 0,
        "probe_delay_secs": 0.0,
    }


async def test_fail_next_refuses_n_requests(worker: Worker) -> None:
    status, _ = await worker.post("/emulator/faults", {"fail_next": 2, "status": 502})
    assert status == 200
    assert (await worker.post("/v1/chat/completions", CHAT))[0] == 502
    assert (await worker.post("/generate", {"text": "x"}))[0] == 502
    assert (await worker.get("/health"))[0] == 200  # probes are not refused
    assert (await worker.post("/v1/chat/completions", CHAT))[0] == 200


async def test_bad_fault_requests_are_rejected(worker: Worker) -> None:
    for body in ({"fail_next": -1}, {"status": 200}, {"stall": "yes"}, {"explode": 1}):
        status, _ = await worker.post("/emulator/faults", body)
        assert status == 400, body
    _, state = await worker.get("/emulator/faults")
    assert state["fail_next"] == 0 and state["status"] == 503


async def test_die_mid_stream_drops_after_first_chunk(worker: Worker) -> None:
    await worker.post("/emulator/faults", {"die_mid_stream_next": 1})
    body = {**CHAT, "max_tokens": 200, "stream": True}
    chunks = []
    with pytest.raises(aiohttp.ClientPayloadError):
        async with worker.http.post(worker.url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200
            async for line in r.content:
                if line.startswith(b"data: "):
                    chunks.append(line)
    assert len(chunks) == 1
    await _until_idle(worker)  # the dropped request left the engine
    events = await worker.sse("/v1/chat/completions", body)  # the next one is whole
    assert events[-1] == "[DONE]"


async def test_die_drops_a_non_streamed_request_without_answer(worker: Worker) -> None:
    await worker.post("/emulator/faults", {"die_mid_stream_next": 1})
    with pytest.raises(aiohttp.ClientError):
        await worker.post("/v1/chat/completions", CHAT)
    assert (await worker.post("/v1/chat/completions", CHAT))[0] == 200


async def test_stall_holds_requests_until_cleared(worker: Worker) -> None:
    await worker.post("/emulator/faults", {"stall": True})
    pending = asyncio.ensure_future(worker.post("/v1/chat/completions", CHAT))
    done, _ = await asyncio.wait([pending], timeout=0.3)
    assert not done, "a stalled worker answered"
    assert await _running(worker) == 0  # accepted, never reached the engine
    assert (await worker.get("/health"))[0] == 200
    await worker.post("/emulator/faults", {"stall": False})
    status, _ = await asyncio.wait_for(pending, 10)
    assert status == 200


async def test_client_going_away_aborts_its_request(worker: Worker) -> None:
    body = {"input_ids": [1] * 40, "stream": True, "sampling_params": {"max_new_tokens": 5000}}
    async with worker.http.post(worker.url + "/generate", json=body) as r:
        assert (await r.content.readline()).startswith(b"data: ")
        assert await _running(worker) == 1
        r.close()
    await _until_idle(worker)

    # not streamed: the handler is cancelled when the connection closes
    task = asyncio.ensure_future(worker.post("/generate", {**body, "stream": False}))
    await eventually(lambda: _running(worker), "the request in the engine")
    task.cancel()
    await _until_idle(worker)
