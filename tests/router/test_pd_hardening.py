"""The router's upstream hardening under PD disaggregation (the proxy's own client, the same rules
as colocated routing): a decode that drops a request it accepted is not retried unless asked, the
router's own descriptor shortage is a 503 that blames no worker, a silent decode is bounded."""

from __future__ import annotations

import orjson
import pytest

from tests.router.conftest import MakeRouter, MakeWorker
from tests.router.fakes import DroppingWorker
from tests.router.pd_fakes import FakeDecode, FakePrefill, Hub
from tests.router.test_hardening_upstream import NoDescriptors
from tests.router.test_pd import CHAT, Pd, start_pd
from tests.router.test_pd_faults import all_released, metrics, post

STREAM = {**CHAT, "stream": True}


class DroppingDecode(DroppingWorker, FakeDecode):
    """A decode that drops the request it read, while the budget lasts."""


@pytest.mark.parametrize("retry_on_reset", [False, True])
async def test_decode_dropping_an_accepted_request_is_retried_only_when_asked(
    make_worker: MakeWorker, make_router: MakeRouter, retry_on_reset: bool
) -> None:
    budget = [1]  # whichever decode gets the first request drops it
    hub = Hub()
    prefill = await make_worker("p", cls=FakePrefill, hub=hub)
    decodes = [
        await make_worker(f"d{i}", cls=DroppingDecode, hub=hub, budget=budget) for i in range(2)
    ]
    router = await make_router([], pd_disaggregation=True,
                               prefill=((prefill.url, prefill.bootstrap_port),),
                               decode_urls=tuple(d.url for d in decodes),
                               retry_on_reset=retry_on_reset)  # fmt: skip
    pd = Pd(router, [prefill], decodes)
    status, _, body = await post(pd, CHAT)
    dropped = [d for d in decodes if d.bodies]
    assert len(dropped) >= 1
    if retry_on_reset:
        assert status == 200 and orjson.loads(body)["choices"][0]["message"]["content"]
        assert len(prefill.bodies) == 2  # a second attempt, with a new pair
    else:
        assert status == 502 and orjson.loads(body)["error"]["code"] == "worker_reset"
        assert len(dropped) == 1 and sum(len(d.bodies) for d in decodes) == 1
        assert len(prefill.bodies) == 1  # no second attempt on either side
    assert not pd.worker(dropped[0].url).healthy
    assert all_released(pd)


async def test_descriptor_shortage_is_503_and_no_instance_is_marked_down(
    make_worker: MakeWorker, make_router: MakeRouter, monkeypatch: pytest.MonkeyPatch
) -> None:
    pd = await start_pd(make_worker, make_router)
    NoDescriptors(monkeypatch, {w.url for w in (*pd.prefills, *pd.decodes)})
    # The router's idle connections to the workers (from its start-up) go; new ones cannot be
    # made: the instances stop serving too, so only the router's shortage can explain a 503.
    for w in (*pd.prefills, *pd.decodes):
        await w.close()
    status, headers, body = await post(pd, CHAT)
    assert status == 503 and headers["Retry-After"] == "1"
    assert orjson.loads(body)["error"]["code"] == "router_overloaded"
    await pd.router.state.registry.check_health()
    assert all(w.healthy for w in pd.router.state.registry.workers.values())
    assert "smetric_retries_total{" not in await metrics(pd)
    assert all_released(pd)


async def test_decode_silent_before_its_head_is_504_and_marked_failed(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    pd = await start_pd(make_worker, make_router, decodes=1, first_byte_timeout_secs=0.4)
    pd.decodes[0].stall = True
    status, _, body = await post(pd, STREAM)
    assert status == 504 and orjson.loads(body)["error"]["code"] == "worker_timeout"
    assert not pd.worker(pd.decodes[0].url).healthy
    pd.decodes[0].release.set()
    assert all_released(pd)


async def test_decode_stalled_mid_stream_ends_it_with_an_error_event(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    pd = await start_pd(make_worker, make_router, decodes=1, stream_idle_timeout_secs=0.4)
    pd.decodes[0].hold_stream = True  # one chunk, then silence
    status, _, body = await post(pd, STREAM)
    assert status == 200
    events = body.split(b"\n\n")
    assert orjson.loads(events[1][len(b"data: ") :])["error"]["code"] == "worker_timeout"
    assert events[2:] == [b"data: [DONE]", b""]
    assert not pd.worker(pd.decodes[0].url).healthy
    m = await metrics(pd)
    assert 'smetric_requests_total{endpoint="/v1/chat/completions",status="stream_error"} 1.0' in m
    pd.decodes[0].release.set()
    assert all_released(pd)
