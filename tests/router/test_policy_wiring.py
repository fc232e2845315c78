"""The view the router builds feeds the policy: hits from the KV index make follow-ups sticky."""

from __future__ import annotations

from typing import Any

import aiohttp

from smetric_router.cluster.kv_index import KvIndex
from smetric_router.cluster.text_tree import TextTree
from smetric_router.core.kv_events import GPU, BlockStored, KVEventBatch
from smetric_router.features.extract import FeatureExtractor
from tests.router.conftest import MakeRouter, MakeWorker

SYSTEM = "You are a coding agent. " * 20
FOLLOW_UP = {
    "model": "fake-model",
    "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "list the files in the repository"},
        {"role": "assistant", "content": "README.md setup.py src/ tests/ " * 5},
        {"role": "user", "content": "open README.md"},
    ],
}


def store(index: KvIndex, worker: str, hashes: list[int], page_size: int) -> None:
    event = BlockStored(
        block_hashes=hashes,
        parent_block_hash=None,
        token_ids=[0] * (len(hashes) * page_size),
        block_size=page_size,
        lora_id=None,
        medium=GPU,
    )
    index.apply(worker, KVEventBatch(0.0, [event]))


async def post(url: str, body: dict[str, Any]) -> tuple[str, str]:
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as resp:
        assert resp.status == 200
        return resp.headers["x-smetric-worker"], resp.headers["x-smetric-reason"]


async def test_follow_up_sticks_to_the_worker_holding_its_history(
    make_worker: MakeWorker, make_router: MakeRouter, codec: Any
) -> None:
    workers = [await make_worker(n) for n in "abc"]
    holder = workers[1]
    features = FeatureExtractor(codec, page_size=16).from_chat(FOLLOW_UP)
    history_pages = features.est_hit // 16
    assert history_pages >= 4
    index = KvIndex()
    store(index, holder.url, list(features.page_hashes[:history_pages]), 16)
    # Every worker holds the system prompt: shared hits do not make a worker sticky.
    for w in workers:
        if w is not holder:
            store(index, w.url, list(features.page_hashes[:2]), 16)
    # The KV index alone: the in-flight view would also credit the holder with the follow-ups
    # it has just served (tests/router/test_inflight.py).
    router = await make_router([w.url for w in workers], hits=index, inflight_prefixes=False)
    url = router.url + "/v1/chat/completions"

    for _ in range(3):
        assert await post(url, FOLLOW_UP) == (holder.url, "sticky")
    # A first turn with the same system prompt is balanced, not sent to the holder.
    first = {**FOLLOW_UP, "messages": FOLLOW_UP["messages"][:2]}
    assert (await post(url, first))[1] == "first-turn-balance"
    # The holder overloaded (in-flight far above the mean): the follow-up is balanced away.
    router.state.registry.workers[holder.url].inflight = 50
    chosen, reason = await post(url, FOLLOW_UP)
    assert (chosen, reason) != (holder.url, "sticky") and reason == "overload-fallback"
    router.state.registry.workers[holder.url].inflight = 0
    # Its cache evicted: balanced like a first request.
    index.clear(holder.url)
    assert (await post(url, FOLLOW_UP))[1] == "evicted-fallback"


async def test_raw_prompt_follow_up_inferred_from_exclusive_hit(
    make_worker: MakeWorker, make_router: MakeRouter, codec: Any
) -> None:
    a, b = await make_worker("a"), await make_worker("b")
    prompt = "def main():\n    return 0\n" * 30
    features = FeatureExtractor(codec, page_size=16).from_generate({"text": prompt})
    index = KvIndex()
    store(index, b.url, list(features.page_hashes), 16)
    router = await make_router([a.url, b.url], hits=index)
    # No hint: the turn is inferred from b's exclusive hit.
    assert await post(router.url + "/generate", {"text": prompt}) == (b.url, "sticky")
    # The hint field is read by the router and not forwarded.
    hinted = {"text": prompt, "smetric": {"turn": 0}}
    chosen, reason = await post(router.url + "/generate", hinted)
    assert reason == "first-turn-balance"
    served = a if chosen == a.url else b
    assert "smetric" not in served.bodies[-1]


async def test_cache_aware_follows_the_text_tree(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    a, b = await make_worker("a"), await make_worker("b")
    tree = TextTree()
    router = await make_router([a.url, b.url], text_tree=tree, policy="cache_aware")
    url = router.url + "/v1/completions"
    long = {"model": "fake-model", "prompt": "shared repository context " * 20 + "task one"}
    first, reason = await post(url, long)
    assert reason == "cache_aware" and tree.size(first) > 0
    # The same prefix follows the tree; an unrelated prompt goes to the smaller tree.
    again = {**long, "prompt": long["prompt"] + " and more"}
    assert await post(url, again) == (first, "cache_aware")
    other, _ = await post(url, {"model": "fake-model", "prompt": "unrelated question"})
    assert other != first
    async with aiohttp.ClientSession() as s, s.post(router.url + "/flush_cache") as resp:
        assert resp.status == 200
    assert tree.size(a.url) == tree.size(b.url) == 0
