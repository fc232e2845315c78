"""--follow-up-priority through the router's HTTP surface, in front of a fake worker: a follow-up
(a continued response among them) reaches the worker asking the set priority, a first turn and a
client's own priority go as sent, /v1/messages (SGLang's has no `priority`) is untouched, and 0
leaves every body alone."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.router.conftest import MakeRouter, MakeWorker
from tests.router.fakes import FakeWorker

FIRST = [{"role": "user", "content": "write a parser"}]
FOLLOW = [*FIRST, {"role": "assistant", "content": "done"}, {"role": "user", "content": "test it"}]


class AllApisWorker(FakeWorker):
    """Answers SGLang's Messages and Responses paths too (with its chat reply: only the bodies
    it receives are read here)."""

    GENERATION_PATHS = (*FakeWorker.GENERATION_PATHS, "/v1/messages", "/v1/responses")


async def _sent(http: aiohttp.ClientSession, url: str, path: str, body: dict[str, Any]) -> str:
    async with http.post(url + path, json={"model": "fake-model", **body}) as r:
        assert r.status == 200, await r.text()
        return r.headers["x-smetric-reason"]


async def test_follow_ups_ask_the_set_priority_and_nothing_else_changes(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    w = await make_worker(cls=AllApisWorker)
    router = await make_router([w.url], follow_up_priority=3)
    chat = "/v1/chat/completions"
    async with aiohttp.ClientSession() as http:
        assert await _sent(http, router.url, chat, {"messages": FIRST}) == "first-turn-balance"
        assert "priority" not in w.bodies[-1]
        await _sent(http, router.url, chat, {"messages": FOLLOW})
        assert w.bodies[-1]["priority"] == 3
        await _sent(http, router.url, chat, {"messages": FOLLOW, "priority": -2})
        assert w.bodies[-1]["priority"] == -2
        await _sent(http, router.url, "/v1/messages", {"messages": FOLLOW, "max_tokens": 8})
        assert "priority" not in w.bodies[-1]
        await _sent(http, router.url, "/v1/responses", {"input": FOLLOW, "store": False})
        assert w.bodies[-1]["priority"] == 3
        # continuing a response the worker stores: a follow-up, whatever its input says
        previous = router.state.response_ids.encode(w.url, "resp_" + "0" * 32)
        body = {"input": "go on", "previous_response_id": previous}
        assert await _sent(http, router.url, "/v1/responses", body) == "response-holder"
        assert w.bodies[-1]["priority"] == 3
    assert len(w.bodies) == 6


async def test_off_by_default_follow_ups_go_as_sent(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    w = await make_worker()
    router = await make_router([w.url])
    async with aiohttp.ClientSession() as http:
        await _sent(http, router.url, "/v1/chat/completions", {"messages": FOLLOW})
    assert "priority" not in w.bodies[-1]
