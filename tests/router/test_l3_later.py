"""The global tier's hit is asked beside the request: where the policy's decision does not turn
on it the worker has the request while the lookup is still out, and the response's x-smetric-hit
carries its answer. A policy whose decision turns on it (--l3-aware-guard) decides only once it
is in."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from smetric_router.cluster.kv_index import L3_MEDIUM, KvIndex
from smetric_router.cluster.l3_view import EventsL3
from smetric_router.core.kv_events import BlockStored, KVEventBatch
from smetric_router.core.types import RequestFeatures
from smetric_router.features.extract import FeatureExtractor
from smetric_router.policies import PolicyParams
from tests.helpers.polling import eventually
from tests.helpers.prometheus import value
from tests.router.conftest import MakeRouter, MakeWorker
from tests.router.fakes import FakeWorker

PAGE = 16
IN_L3 = 12  # pages of the prompt the tier holds
BODY = {"model": "fake-model",
        "messages": [{"role": "system", "content": "You are a coding agent. " * 40},
                     {"role": "user", "content": "List the files."}]}  # fmt: skip


class GatedL3(EventsL3):
    """The L3 events view, answering each lookup only once `gate` is set; notes how many
    requests the worker had received when it answered."""

    def __init__(self, index: KvIndex, worker: FakeWorker) -> None:
        super().__init__(index)
        self.gate = asyncio.Event()
        self.worker = worker
        self.seen_at_answer: list[int] = []

    async def lookup(self, prefix: str, features: RequestFeatures) -> int | None:
        await self.gate.wait()
        self.seen_at_answer.append(len(self.worker.bodies))
        return await super().lookup(prefix, features)


async def start(make_worker: MakeWorker, make_router: MakeRouter, codec: Any,
                **overrides: Any) -> tuple[FakeWorker, GatedL3, str]:  # fmt: skip
    worker = await make_worker("a")
    index = KvIndex()
    hashes = FeatureExtractor(codec, page_size=PAGE).from_chat(BODY).page_hashes
    assert len(hashes) > IN_L3
    stored = BlockStored(list(hashes[:IN_L3]), None, [], PAGE, None, L3_MEDIUM)
    index.apply("http://elsewhere:1", KVEventBatch(0.0, [stored]))
    l3 = GatedL3(index, worker)
    router = await make_router([worker.url], hits=index, l3=l3, l3_view="events", **overrides)
    return worker, l3, router.url


async def post(url: str) -> tuple[dict[str, str], str]:
    async with aiohttp.ClientSession() as s:
        async with s.post(url + "/v1/chat/completions", json=BODY) as r:
            assert r.status == 200
            await r.read()
        async with s.get(url + "/metrics") as m:
            return dict(r.headers), await m.text()


# smetric-l3move reads the tier, but a first turn's placement never turns on it
@pytest.mark.parametrize("policy", ["smetric", "smetric-l3move"])
async def test_the_worker_has_the_request_while_the_tier_is_still_asked(
    make_worker: MakeWorker, make_router: MakeRouter, codec: Any, policy: str
) -> None:
    worker, l3, url = await start(make_worker, make_router, codec, policy=policy)
    answered = asyncio.create_task(post(url))
    await eventually(lambda: len(worker.bodies) == 1, "the worker receiving the request")
    assert not answered.done()  # its headers wait for the tier's answer
    l3.gate.set()
    headers, metrics = await answered
    assert l3.seen_at_answer == [1]
    assert headers["x-smetric-hit"] == f"gpu=0; host=0; l3={IN_L3 * PAGE}"
    assert headers["x-smetric-tier"] == "l3"
    # counted by tier once the answer came, not as a stage of the decision
    assert value(metrics, "smetric_routed_prefix_tokens_total", tier="l3") == IN_L3 * PAGE
    assert value(metrics, "smetric_decision_stage_seconds_count", stage="l3") is None


async def test_a_policy_that_reads_the_tier_decides_after_its_answer(
    make_worker: MakeWorker, make_router: MakeRouter, codec: Any
) -> None:
    _, l3, url = await start(make_worker, make_router, codec,
                             policy_params=PolicyParams(l3_aware=True))  # fmt: skip
    l3.gate.set()
    headers, metrics = await post(url)
    assert l3.seen_at_answer == [0]
    assert headers["x-smetric-hit"] == f"gpu=0; host=0; l3={IN_L3 * PAGE}"
    assert value(metrics, "smetric_routed_prefix_tokens_total", tier="l3") == IN_L3 * PAGE
    assert value(metrics, "smetric_decision_stage_seconds_count", stage="l3") == 1
