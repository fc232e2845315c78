"""PD on the proxy's own client (router/upstream.py): one pool and one bound on connections with
colocated routing, its strict parsing, and the decode's bounds."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from aiohttp import web

from tests.helpers.polling import eventually
from tests.router.conftest import MakeRouter, MakeWorker
from tests.router.pd_fakes import FakeDecode, FakePrefill, Hub
from tests.router.test_malformed_replies import BAD_BODIES, BAD_HEADS, PARTIAL
from tests.router.test_pd import CHAT, Pd, start_pd
from tests.router.test_pd_faults import all_released, post


class RawDecode(FakeDecode):
    """A decode that answers with `raw` (once its KV has come, so the prefill ends well)."""

    raw = b""

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        await self.hub.room(
            (body["bootstrap_host"], body["bootstrap_port"], body["bootstrap_room"])
        ).wait()
        transport = request.transport
        assert transport is not None
        transport.write(self.raw)
        transport.close()
        return web.Response()


# A malformed head may be answered better by another decode; a body cut short was sent and run.
CASES = {
    "bad head": (BAD_HEADS["length with an underscore"], "worker_unavailable"),
    "short body": (BAD_BODIES["shorter than its length, then the end"], "worker_reset"),
}


@pytest.mark.parametrize(("reply", "code"), CASES.values(), ids=CASES.keys())
async def test_pd_decode_with_a_malformed_reply_is_a_502(
    make_worker: MakeWorker, make_router: MakeRouter, reply: bytes, code: str
) -> None:
    hub = Hub()
    prefill = await make_worker("p", cls=FakePrefill, hub=hub)
    decode = await make_worker("d", cls=RawDecode, hub=hub)
    decode.raw = reply
    router = await make_router([], pd_disaggregation=True,
                               prefill=((prefill.url, prefill.bootstrap_port),),
                               decode_urls=(decode.url,))  # fmt: skip
    pd = Pd(router, [prefill], [decode])
    status, headers, raw = await post(pd, CHAT)
    assert status == 502 and PARTIAL not in raw
    assert orjson.loads(raw)["error"]["code"] == code
    assert headers["x-smetric-worker"] == decode.url
    await eventually(
        lambda: router.state.proxy.upstream.open == 1, "the prefill's connection pooled"
    )
    assert all_released(pd)


async def test_pd_shares_the_connection_pool_and_its_bound(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    pd = await start_pd(make_worker, make_router, prefills=1, decodes=1)
    upstream = pd.router.state.proxy.upstream
    assert pd.router.state.pd is not None and pd.router.state.pd.upstream is upstream
    for _ in range(3):
        status, _, _ = await post(pd, CHAT)
        assert status == 200
    assert upstream.open == 2  # one keep-alive connection to each side, reused
    assert all_released(pd)


async def test_pd_decode_waiting_for_its_kv_is_not_stalled_while_its_prefill_runs(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    pd = await start_pd(make_worker, make_router, prefills=1, decodes=1,
                        first_byte_timeout_secs=0.3)  # fmt: skip
    prefill = pd.prefills[0]
    prefill.stall = True  # hands the KV over only when released, past the decode's bound
    asyncio.get_running_loop().call_later(0.8, prefill.release.set)
    status, _, raw = await post(pd, {**CHAT, "stream": True})
    assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
    assert b"error" not in raw
    assert pd.worker(pd.decodes[0].url).healthy
    assert all_released(pd)
