"""Agent session headers over HTTP: what a session hint changes in the router's decisions, that
without one nothing changes, and per-endpoint metrics and headers."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from smetric_router.policies.session_home import rank
from smetric_router.router.routing import Endpoint
from tests.e2e.conftest import StackFactory
from tests.e2e.test_fallbacks import worker_state
from tests.helpers.polling import eventually
from tests.helpers.prometheus import total

CLAUDE_CODE = "x-claude-code-session-id"


class Session:
    """One agent conversation through the router, with the agent's session header or without."""

    def __init__(self, http: aiohttp.ClientSession, url: str, model: str,
                 tag: str, headers: dict[str, str]) -> None:  # fmt: skip
        self.http, self.url, self.model, self.headers = http, url, model, headers
        self.messages: list[dict[str, str]] = [
            {"role": "system", "content": f"Agent {tag}. " * 20},
            {"role": "user", "content": f"Task {tag}: port the build to meson. " * 10},
        ]

    async def turn(self) -> tuple[str, str]:
        body = {"model": self.model, "messages": self.messages, "max_tokens": 24}
        async with self.http.post(
            f"{self.url}/v1/chat/completions", json=body, headers=self.headers
        ) as r:
            assert r.status == 200, await r.text()
            reply = await r.json()
            decision = (r.headers["x-smetric-worker"], r.headers["x-smetric-reason"])
        self.messages.append(
            {"role": "assistant", "content": reply["choices"][0]["message"]["content"]}
        )
        self.messages.append({"role": "user", "content": "Tool result: 3 files changed. " * 8})
        return decision


async def worker_urls(http: aiohttp.ClientSession, router: str) -> list[str]:
    async with http.get(f"{router}/workers") as r:
        return [w["url"] for w in (await r.json())["workers"]]


async def indexed(http: aiohttp.ClientSession, router: str, worker: str) -> None:
    async def has_pages() -> bool:
        return bool((await worker_state(http, router, worker))["kv_pages"]["gpu"])

    await eventually(has_pages, f"{worker}'s KV events to reach the router")


async def flushed(http: aiohttp.ClientSession, router: str, worker: str) -> None:
    async with http.post(f"{worker}/flush_cache") as r:
        assert r.status == 200, await r.text()

    async def empty() -> bool:
        pages: int = (await worker_state(http, router, worker))["kv_pages"]["gpu"]
        return pages == 0

    await eventually(empty, "the flush to reach the router through KV events")


async def idle(http: aiohttp.ClientSession, router: str) -> None:
    async def all_idle() -> bool:
        async with http.get(f"{router}/workers") as r:
            return all(w["load"] == 0 for w in (await r.json())["workers"])

    await eventually(all_idle, "every worker's load to read 0")


async def test_session_header_sends_a_homeless_follow_up_home(make_stack: StackFactory) -> None:
    stack = make_stack(workers=3)
    async with aiohttp.ClientSession() as http:
        urls = await worker_urls(http, stack.url)
        sid = "54c1eb09-bc4c-4d2f-98eb-6d2ab2d5e2fe"
        home = max(urls, key=lambda u: rank(sid, u))
        s = Session(http, stack.url, stack.spec.workers.model_name, "hinted", {CLAUDE_CODE: sid})

        await idle(http, stack.url)
        # All idle: a tie on least load, broken by the hint (not round-robin).
        assert await s.turn() == (home, "first-turn-balance")
        await indexed(http, stack.url, home)
        assert await s.turn() == (home, "sticky")

        # The holder lost the session's cache: without a hint the follow-up would go to the least
        # loaded worker; with it, to the session's home (not overloaded), which is the same
        # worker here: it rebuilds the cache once, and every router replica agrees on it.
        await flushed(http, stack.url, home)
        assert await s.turn() == (home, "session-hint-fallback")
        await indexed(http, stack.url, home)
        assert await s.turn() == (home, "sticky")


async def test_without_a_session_header_the_follow_up_is_balanced(
    make_stack: StackFactory,
) -> None:
    stack = make_stack(workers=3)
    async with aiohttp.ClientSession() as http:
        s = Session(http, stack.url, stack.spec.workers.model_name, "plain", {})
        holder, reason = await s.turn()
        assert reason == "first-turn-balance"
        await indexed(http, stack.url, holder)
        assert await s.turn() == (holder, "sticky")
        await flushed(http, stack.url, holder)
        assert (await s.turn())[1] == "evicted-fallback"


async def test_claude_code_metadata_on_messages_is_read_as_the_hint(
    make_stack: StackFactory,
) -> None:
    # Claude Code also names its session in the Messages body's metadata.user_id (a JSON string)
    stack = make_stack(workers=3)
    async with aiohttp.ClientSession() as http:
        urls = await worker_urls(http, stack.url)
        for i in range(6):
            sid = f"5f0c1e2d-0000-4000-8000-{i:012d}"
            user_id = json.dumps({"device_id": "d" * 64, "account_uuid": "", "session_id": sid})
            body = {
                "model": stack.spec.workers.model_name,
                "max_tokens": 4,
                "metadata": {"user_id": user_id},
                "messages": [{"role": "user", "content": f"Session {i}: list the files."}],
            }
            await idle(http, stack.url)
            async with http.post(f"{stack.url}/v1/messages", json=body) as r:
                assert r.status == 200, await r.text()
                await r.read()
                got = (r.headers["x-smetric-worker"], r.headers["x-smetric-reason"])
            # each session's first request at its own home (round-robin would not be)
            assert got == (max(urls, key=lambda u: rank(sid, u)), "first-turn-balance")


# A body for each generation endpoint, by path: a new Endpoint needs one here.
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    "/v1/completions": {"prompt": "hi", "max_tokens": 4},
    "/generate": {"text": "hi", "sampling_params": {"max_new_tokens": 4}},
    "/v1/messages": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    "/v1/responses": {"input": "hi", "max_output_tokens": 4},
}


@pytest.mark.parametrize("endpoint", [e.value for e in Endpoint])
async def test_each_endpoint_has_its_own_metrics_and_decision_headers(
    make_stack: StackFactory, endpoint: str
) -> None:
    stack = make_stack(workers=3)
    assert endpoint in BODIES, f"add a request body for {endpoint} to BODIES"
    body = {"model": stack.spec.workers.model_name, **BODIES[endpoint]}
    others = [e.value for e in Endpoint if e.value != endpoint]
    async with aiohttp.ClientSession() as http:

        async def scrape() -> str:
            async with http.get(f"{stack.url}/metrics") as r:
                return await r.text()

        before = await scrape()
        async with http.post(f"{stack.url}{endpoint}", json=body) as r:
            assert r.status == 200, await r.text()
            await r.read()
            reason = r.headers["x-smetric-reason"]
            assert r.headers["x-smetric-worker"] in await worker_urls(http, stack.url)
        after = await scrape()

    def delta(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert delta("smetric_requests_total", endpoint=endpoint, status="200") == 1
    assert delta("smetric_endpoint_decisions_total", endpoint=endpoint, reason=reason) == 1
    assert delta("smetric_request_duration_seconds_count", endpoint=endpoint) == 1
    for other in others:  # nothing counted under another endpoint's label
        assert delta("smetric_requests_total", endpoint=other) == 0
        assert delta("smetric_endpoint_decisions_total", endpoint=other) == 0
