"""Model names as SGLang takes them: one model answers to any name; several are routed by name."""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import web

from tests.router.conftest import MakeRouter, MakeWorker
from tests.router.fakes import FakeWorker

MESSAGES = [{"role": "user", "content": "hi"}]


class AnyNameWorker(FakeWorker):
    """Answers whatever model is asked, as SGLang does; records the names asked."""

    def __init__(self, name: str, *, alias: str | None = None, **kw: Any) -> None:
        super().__init__(name, **kw)
        self.alias = alias  # model_info's model_path, when it differs from the served name
        self.asked: list[str | None] = []

    async def _model_info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": self.alias or self.model, "is_generation": True})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        self.asked.append((await request.json()).get("model"))
        return web.json_response(self.reply(request.path))


async def _chat(s: aiohttp.ClientSession, url: str, model: str) -> tuple[int, str, Any]:
    body = {"model": model, "messages": MESSAGES}
    async with s.post(url + "/v1/chat/completions", json=body) as r:
        return r.status, r.headers.get("x-smetric-worker", ""), await r.json()


async def test_one_model_answers_to_any_name(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    # two workers of one model, one also known by its path (SGLang's model_info)
    a = await make_worker("a", cls=AnyNameWorker, model="m", alias="/models/m")
    b = await make_worker("b", cls=AnyNameWorker, model="m")
    router = await make_router([a.url, b.url])
    async with aiohttp.ClientSession() as s:
        seen = set()
        for name in ("default", "gpt-4o", "m", "/models/m", "", "default"):
            status, worker, _ = await _chat(s, router.url, name)
            assert status == 200, name
            seen.add(worker)
        assert seen == {a.url, b.url}  # an unknown name is balanced over every worker
        async with s.post(router.url + "/generate", json={"text": "x", "model": "any"}) as r:
            assert r.status == 200
    # the name goes on as the client sent it: SGLang echoes it back
    assert sorted(a.asked + b.asked, key=str) == sorted(
        ["default", "gpt-4o", "m", "/models/m", "", "default", "any"], key=str
    )


async def test_several_models_are_routed_by_name(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    a = await make_worker("a", cls=AnyNameWorker, model="coder")
    b = await make_worker("b", cls=AnyNameWorker, model="chat")
    router = await make_router([a.url, b.url])
    async with aiohttp.ClientSession() as s:
        for _ in range(3):
            assert (await _chat(s, router.url, "coder"))[:2] == (200, a.url)
            assert (await _chat(s, router.url, "chat"))[:2] == (200, b.url)
        for name in ("default", "gpt-4o"):
            status, _, body = await _chat(s, router.url, name)
            assert status == 404
            assert body["error"]["code"] == "model_not_found" and body["error"]["param"] == "model"
            assert name in body["error"]["message"]
        async with s.post(router.url + "/generate", json={"text": "x", "model": "nope"}) as r:
            assert r.status == 404
    assert a.asked == ["coder"] * 3 and b.asked == ["chat"] * 3
