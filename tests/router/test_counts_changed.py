"""The registry's counts_changed is set when a request is sent to a worker and when it is
answered: what shares the router's own counts with other replicas wakes on it."""

from __future__ import annotations

import asyncio

import aiohttp

from smetric_router.router.pd import _Held
from smetric_router.router.workers import PrefillShare, Role, Worker
from tests.helpers.polling import eventually
from tests.router.conftest import MakeRouter, MakeWorker

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello " * 20}]}


async def test_a_dispatch_and_its_answer_each_set_counts_changed(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    worker = await make_worker("a")
    worker.stall = True
    r = await make_router([worker.url])
    changed = r.state.registry.counts_changed
    changed.clear()
    async with aiohttp.ClientSession() as http:
        reply = asyncio.create_task(http.post(r.url + "/v1/chat/completions", json=CHAT))
        await asyncio.wait_for(changed.wait(), 10)  # sent: in flight on a
        assert r.state.registry.workers[worker.url].inflight == 1
        changed.clear()
        worker.release.set()
        resp = await reply
        assert resp.status == 200, await resp.text()
        await resp.read()
        await eventually(
            lambda: r.state.registry.workers[worker.url].inflight == 0, "the request answered"
        )
        assert changed.is_set()  # answered


def test_a_pd_pair_counts_its_dispatch_its_prefill_and_its_end_once_each() -> None:
    calls: list[str] = []
    prefill, decode = Worker("http://p:1", Role.PREFILL), Worker("http://d:1", Role.DECODE)
    held = _Held(prefill, decode, 10, 30, lambda: calls.append("changed"))
    assert (prefill.tokens, decode.tokens, len(calls)) == (10, 30, 1)
    held.prefill_done()
    held.prefill_done()
    assert (prefill.tokens, len(calls)) == (0, 2)
    held.release()
    held.release()
    assert (decode.tokens, decode.inflight, len(calls)) == (0, 0, 3)


def test_a_prefill_share_counts_its_first_byte_once() -> None:
    calls: list[str] = []
    worker = Worker("http://a:1")
    share = PrefillShare(worker, 500, lambda: calls.append("changed"))
    assert (worker.unprefilled, calls) == (500, [])  # the dispatch itself is counted by _send
    share.done()
    share.done()
    assert (worker.unprefilled, len(calls)) == (0, 1)
