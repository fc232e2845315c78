"""A prefill's unprefilled-token load keeps the requests in its PD bootstrap queue.

SGLang 0.5.23's `num_waiting_uncached_tokens` (/v1/loads) sums the waiting queue only: a request
whose decode has not bootstrapped yet (the prefill's bootstrap queue) counts 0 there, although its
prompt is still to be prefilled (measured: tests/real_sglang/test_pd.py). The router's own count
runs from dispatch until the prefill is done, so it covers them; a fresh report of 0 must neither
replace nor lower it.
"""

from __future__ import annotations

import asyncio

import aiohttp

from smetric_router.router.workers import Role, Worker
from tests.helpers.polling import eventually
from tests.router.conftest import MakeRouter, MakeWorker
from tests.router.test_pd_policy import chat, first_turn, flood, start


def test_a_report_without_the_bootstrap_queue_keeps_the_own_count() -> None:
    w = Worker("http://p", role=Role.PREFILL, tokens=900)  # dispatched, decode not bootstrapped
    # The prefill reports 0 waiting uncached tokens: our 900 sit in its bootstrap queue.
    w.reported_load, w.reported_at, w.own_at_report = 0.0, 99.0, 900
    assert w.load(now=100.0, max_age=3.0) == 900.0
    # Another router's 300 tokens wait in its queue while ours are still in bootstrap: the report
    # (300) is below our own count, so no foreign share is added; ours are never given up.
    w.reported_load = 300.0
    assert w.load(now=100.0, max_age=3.0) >= 900.0
    w.tokens = 0  # ours prefilled and handed over
    assert w.load(now=100.0, max_age=3.0) == 0.0


async def test_bootstrap_queue_requests_count_while_the_prefill_reports_none(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    (a, b), _, router = await start(make_worker, make_router, 2, load_poll_interval_secs=0.05)
    registry = router.state.registry
    worker = registry.workers[a.url]
    a.stall = True  # a holds its request as SGLang's bootstrap queue does: no KV handed over
    a.waiting_uncached = 0  # ... and, like SGLang, reports none of it as waiting uncached tokens
    async with aiohttp.ClientSession() as s:
        pending = await flood(s, router.url, a, b)
        await eventually(lambda: registry.workers[b.url].tokens == 0, "b done with its requests")
        own = worker.tokens
        assert own > 700  # the long prompt, unprefilled
        # Several fresh reports of 0 arrive after the dispatch: the load stays the own count.
        since = worker.reported_at
        await eventually(
            lambda: worker.reported_at > since + 0.2 and worker.reported_load == 0,
            "fresh reports of no load",
        )
        async with s.get(router.url + "/workers") as resp:
            listed = {w["url"]: w for w in (await resp.json())["workers"]}
        assert listed[a.url]["load"] == own and listed[a.url]["reported_load"] == 0
        # So first turns keep avoiding a while its request waits in the bootstrap queue.
        for i in range(4, 7):
            assert await chat(s, router.url, first_turn(i)) == (b.url, "first-turn-balance")
        assert len(a.bodies) == 1
        a.release.set()  # the decode bootstrapped: the prefill runs and hands the KV over
        await asyncio.gather(*pending)
    assert worker.tokens == 0
    await eventually(
        lambda: worker.load(worker.reported_at, registry.max_load_age) == 0,
        "the prefill's load back to 0",
    )
