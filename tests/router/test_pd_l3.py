"""PD: what a prefill will load from the global tier (L3) is not counted as tokens to prefill.

An in-process router (`--l3-view events`: the fork's L3 events kept in the KV index) over fake
prefill/decode workers; the prefill holds its request (as SGLang's bootstrap queue does) while the
router's own count of its unprefilled tokens is read.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from smetric_router.cluster.kv_index import L3_MEDIUM, KvIndex
from smetric_router.cluster.l3_view import EventsL3
from smetric_router.core.kv_events import BlockStored, KVEventBatch
from smetric_router.features.extract import FeatureExtractor
from tests.helpers.polling import eventually
from tests.router.conftest import MakeRouter, MakeWorker
from tests.router.test_pd_policy import chat, first_turn, start

PAGE = 16


async def held_tokens(
    make_worker: MakeWorker, make_router: MakeRouter, codec: Any, l3_pages: int
) -> tuple[int, int]:
    """(prompt tokens, tokens the router counts on the prefill while it holds the request)."""
    index = KvIndex()
    body = first_turn(0)
    f = FeatureExtractor(codec, page_size=PAGE).from_chat(body)
    if l3_pages:
        stored = BlockStored(list(f.page_hashes[:l3_pages]), None, [], PAGE, None, L3_MEDIUM)
        index.apply("http://elsewhere:1", KVEventBatch(0.0, [stored]))
    (p,), _, router = await start(make_worker, make_router, 1, hits=index, l3=EventsL3(index),
                                  l3_view="events")  # fmt: skip
    p.stall = True
    worker = router.state.registry.workers[p.url]
    async with aiohttp.ClientSession() as s:
        pending = asyncio.create_task(chat(s, router.url, body))
        await eventually(lambda: len(p.bodies) == 1, "the prefill holding the request")
        held = worker.tokens
        p.release.set()
        await pending
    return f.prompt_len, held


async def test_l3_hits_are_not_counted_as_tokens_to_prefill(
    make_worker: MakeWorker, make_router: MakeRouter, codec: Any
) -> None:
    prompt, held = await held_tokens(make_worker, make_router, codec, l3_pages=20)
    assert prompt > 20 * PAGE
    assert held == prompt - 20 * PAGE


async def test_without_l3_the_whole_prompt_is_to_prefill(
    make_worker: MakeWorker, make_router: MakeRouter, codec: Any
) -> None:
    prompt, held = await held_tokens(make_worker, make_router, codec, l3_pages=0)
    assert held == prompt
