"""Every baseline policy through a router process over launched emulated workers: each serves and
answers with its own name as the decision's reason."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from smetric_router.launch import Stack
from smetric_router.policies import policy_names
from tests.e2e.conftest import ROUTER_ARGS, StackFactory
from tests.e2e.raw import generate, token_ids, wait_indexed
from tests.helpers.polling import eventually
from tests.reported import reported

BASELINES = [p for p in policy_names() if not p.startswith("smetric")]


@pytest.fixture(scope="module")
def stack(make_stack: StackFactory) -> Stack:
    """Two emulated workers, shared by the module's routers."""
    return make_stack(workers=2)


@asynccontextmanager
async def router(
    stack: Stack, tmp_path: Path, policy: str
) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    """A router process with `policy` over the stack's workers, ready; its URL and a session."""
    args = ["smetric_router", "--port", "0", "--policy", policy, *ROUTER_ARGS,
            "--worker-urls", *stack.worker_urls]  # fmt: skip
    with reported(args, tmp_path / "router.json") as ports:
        url = f"http://127.0.0.1:{ports['http']}"
        async with aiohttp.ClientSession() as http:

            async def ready() -> bool:
                async with http.get(f"{url}/readiness") as r:
                    return r.status == 200

            await eventually(ready, f"the {policy} router's readiness")
            yield url, http


def test_every_policy_but_smetric_is_a_baseline() -> None:
    assert set(BASELINES) == {"bailian", "lmetric", "lmetric-inflight",
                              "load_balance", "least_tokens", "cache_aware", "round_robin",
                              "random", "power_of_two"}  # fmt: skip


@pytest.mark.parametrize("policy", BASELINES)
async def test_baseline_policy_through_the_router(
    stack: Stack, tmp_path: Path, policy: str
) -> None:
    model = stack.spec.workers.model_name
    async with router(stack, tmp_path, policy) as (url, http):
        prompt = token_ids(seed=7, n=320)
        for ids, hint in ((prompt, {}), (prompt + [9] * 48, {"x-smetric-turn": "1"})):
            worker, reason = await generate(http, url, ids, hint)
            assert (worker in stack.worker_urls, reason) == (True, policy)
        messages = [{"role": "user", "content": f"Which policy? {policy}"}]
        chat = {"model": model, "max_tokens": 4, "messages": messages}
        async with http.post(f"{url}/v1/chat/completions", json=chat) as r:
            assert r.status == 200, await r.text()
            assert r.headers["x-smetric-reason"] == policy
            assert (await r.json())["choices"][0]["message"]["content"]


async def test_smetric_paper_through_the_router(stack: Stack, tmp_path: Path) -> None:
    """Figure 13 as written serves with SMetric's reasons: a first turn balanced, its follow-up
    stuck to the worker that now holds its prefix."""
    async with router(stack, tmp_path, "smetric-paper") as (url, http):
        prompt = token_ids(seed=11, n=320)
        first, reason = await generate(http, url, prompt, {})
        assert reason == "first-turn-balance"

        async def stuck() -> bool:  # once the first turn's KV events reached the router
            worker, why = await generate(http, url, prompt + [9] * 48, {"x-smetric-turn": "1"})
            return (worker, why) == (first, "sticky")

        await eventually(stuck, "the follow-up sticking to its first turn's worker")


@pytest.mark.parametrize("policy", ["smetric-ftcost", "smetric-ftband", "smetric-delay"])
async def test_first_turns_by_cost_go_to_their_templates_holder(
    stack: Stack, tmp_path: Path, policy: str
) -> None:
    """New sessions opening with a 320-token template, one after another, all go to the worker
    that holds it (16 new tokens there against 336 on the other; with nothing else in flight the
    holder is inside smetric-ftband's band of load and nothing is unprefilled anywhere for
    smetric-delay), still as first turns; `smetric` would alternate them between the two idle
    workers."""
    template = token_ids(seed=21, n=320)
    async with router(stack, tmp_path, policy) as (url, http):
        first = "x-smetric-turn"
        holder, reason = await generate(http, url, template + token_ids(22, 16), {first: "0"})
        assert reason == "first-turn-balance"
        await wait_indexed(http, url, holder, template)
        placed = [await generate(http, url, template + token_ids(seed, 16), {first: "0"})
                  for seed in range(23, 27)]  # fmt: skip
        assert placed == [(holder, "first-turn-balance")] * 4, placed
