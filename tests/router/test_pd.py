"""PD disaggregation over HTTP: bootstrap fields, the decode's reply, headers, streams, admin."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from smetric_router.router.pd import bootstrap_host
from tests.router.conftest import MakeRouter, MakeWorker, RouterUnderTest
from tests.router.pd_fakes import FakeDecode, FakePrefill, Hub

CHAT = {
    "model": "fake-model",
    "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
}


class Pd:
    def __init__(self, router: RouterUnderTest, prefills: list[Any], decodes: list[Any]) -> None:
        self.router, self.prefills, self.decodes = router, prefills, decodes
        self.url = router.url

    def worker(self, url: str) -> Any:
        return self.router.state.registry.workers[url]


async def start_pd(
    make_worker: MakeWorker,
    make_router: MakeRouter,
    prefills: int = 2,
    decodes: int = 2,
    kv_timeout: float | None = None,
    **overrides: Any,
) -> Pd:
    hub = Hub()
    ps = [await make_worker(f"p{i}", cls=FakePrefill, hub=hub) for i in range(prefills)]
    ds = [
        await make_worker(f"d{i}", cls=FakeDecode, hub=hub, kv_timeout=kv_timeout)
        for i in range(decodes)
    ]
    # The first prefill's bootstrap port is configured, the others' read from /server_info.
    spec = tuple((p.url, p.bootstrap_port if i == 0 else None) for i, p in enumerate(ps))
    router = await make_router(
        [],
        pd_disaggregation=True,
        prefill=spec,
        decode_urls=tuple(d.url for d in ds),
        **overrides,
    )
    return Pd(router, ps, ds)


async def test_bootstrap_fields_go_to_both_and_the_decode_answers(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    pd = await start_pd(make_worker, make_router)
    assert pd.worker(pd.prefills[1].url).bootstrap_port == pd.prefills[1].bootstrap_port
    seen = set()
    async with aiohttp.ClientSession() as s:
        for i in range(4):  # four sessions' first turns (a repeated prompt would go to its holder)
            body = {**CHAT, "messages": [{"role": "user", "content": f"session {i}: hello"}]}
            async with s.post(pd.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                prefill_url = resp.headers["x-smetric-prefill-worker"]
                decode_url = resp.headers["x-smetric-worker"]
                assert resp.headers["x-smetric-reason"] == "first-turn-balance"
                reply = await resp.json()
            decode = next(d for d in pd.decodes if d.url == decode_url)
            prefill = next(p for p in pd.prefills if p.url == prefill_url)
            assert reply["choices"][0]["message"]["content"] == f"hello from {decode.name}"
            sent = decode.bodies[-1]
            assert prefill.bodies[-1] == sent  # the same body to both
            assert sent["bootstrap_host"] == "127.0.0.1"
            assert sent["bootstrap_port"] == prefill.bootstrap_port
            assert 0 <= sent["bootstrap_room"] < 2**63
            assert sent["messages"] == body["messages"]
            seen.add((prefill_url, decode_url))
    # Both sides balance: every prefill and every decode took part.
    assert {p for p, _ in seen} == {p.url for p in pd.prefills}
    assert {d for _, d in seen} == {d.url for d in pd.decodes}
    rooms = [p.bodies[i]["bootstrap_room"] for p in pd.prefills for i in range(len(p.bodies))]
    assert len(set(rooms)) == 4  # a fresh room per request
    for w in pd.router.state.registry.workers.values():
        assert (w.inflight, w.tokens) == (0, 0)


async def test_batched_generate_gets_one_room_per_prompt(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    pd = await start_pd(make_worker, make_router, prefills=1, decodes=1)
    prefill = pd.prefills[0]
    async with aiohttp.ClientSession() as s:
        body = {"text": ["a b c", "d e f", "g h"], "sampling_params": {"max_new_tokens": 2}}
        async with s.post(pd.url + "/generate", json=body) as resp:
            assert resp.status == 200
        sent = pd.decodes[0].bodies[-1]
        assert sent["bootstrap_host"] == ["127.0.0.1"] * 3
        assert sent["bootstrap_port"] == [prefill.bootstrap_port] * 3
        assert len(set(sent["bootstrap_room"])) == 3
        # A batch on /v1/completions has no per-prompt fields in SGLang: refused clearly.
        batch = {"model": "fake-model", "prompt": ["one", "two"]}
        async with s.post(pd.url + "/v1/completions", json=batch) as resp:
            assert resp.status == 400
            assert "PD disaggregation" in (await resp.json())["error"]["message"]
    assert len(prefill.bodies) == 1


def test_bootstrap_host_is_the_prefill_hostname_with_ipv6_bracketed() -> None:
    assert bootstrap_host("http://10.0.0.7:30000") == "10.0.0.7"
    assert bootstrap_host("http://gpu-node-3:30000") == "gpu-node-3"
    assert bootstrap_host("http://[fd00::1]:30000") == "[fd00::1]"


async def test_stream_passes_through_from_the_decode(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    pd = await start_pd(make_worker, make_router, prefills=1, decodes=1)
    decode = pd.decodes[0]
    decode.hold_stream = True
    body = {**CHAT, "stream": True}
    url = pd.url + "/v1/chat/completions"
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
        assert r.status == 200
        assert r.headers["x-smetric-worker"] == decode.url
        assert r.headers["x-smetric-prefill-worker"] == pd.prefills[0].url
        first = await r.content.readuntil(b"\n\n")
        assert not decode.release.is_set()  # the decode still holds the rest back
        assert orjson.loads(first[len(b"data: ") :])["choices"][0]["delta"]["content"] == "hello"
        # The first decode byte proved the prefill done: its unprefilled tokens are gone.
        prefill = pd.worker(pd.prefills[0].url)
        assert (prefill.inflight, prefill.tokens) == (0, 0)
        assert pd.worker(decode.url).tokens > 0  # the decode holds the request's KV
        decode.release.set()
        rest = await r.read()
    assert rest.endswith(b"data: [DONE]\n\n") and b" d0" in rest
    assert pd.worker(decode.url).tokens == 0


async def test_admin_lists_both_roles_and_fans_out(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    pd = await start_pd(make_worker, make_router, prefills=1, decodes=1)
    p, d = pd.prefills[0], pd.decodes[0]
    async with aiohttp.ClientSession() as s:
        async with s.get(pd.url + "/workers") as resp:
            listed = {w["url"]: w for w in (await resp.json())["workers"]}
        assert listed[p.url]["role"] == "prefill"
        assert listed[p.url]["bootstrap_port"] == p.bootstrap_port
        assert listed[d.url]["role"] == "decode"
        async with s.get(pd.url + "/v1/models") as resp:
            assert [m["id"] for m in (await resp.json())["data"]] == ["fake-model"]
        async with s.post(pd.url + "/flush_cache") as resp:
            assert resp.status == 200
        assert (p.flushes, d.flushes) == (1, 1)
        async with s.get(pd.url + "/readiness") as resp:
            assert resp.status == 200
        # A decode joins at runtime; a worker without a role is refused under PD.
        extra = await make_worker("d1", cls=FakeDecode, hub=Hub())
        async with s.post(pd.url + "/workers", json={"url": extra.url}) as resp:
            assert resp.status == 400
            assert "role" in (await resp.json())["error"]["message"]
        async with s.post(pd.url + "/workers", json={"url": extra.url, "role": "decode"}) as r:
            assert r.status == 200
            assert (await r.json())["worker"]["role"] == "decode"
        # Without a healthy decode no request can be served: not ready.
        pd.worker(d.url).healthy = pd.worker(extra.url).healthy = False
        async with s.get(pd.url + "/readiness") as resp:
            assert resp.status == 503


async def test_prefill_without_a_bootstrap_port_is_excluded_with_a_reason(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    hub = Hub()
    mute = await make_worker("mute", cls=FakePrefill, hub=hub, report_port=False)
    good = await make_worker("good", cls=FakePrefill, hub=hub)
    d = await make_worker("d", cls=FakeDecode, hub=hub)
    router = await make_router(
        [],
        pd_disaggregation=True,
        prefill=((mute.url, None), (good.url, None)),
        decode_urls=(d.url,),
    )
    w = router.state.registry.workers[mute.url]
    assert not w.healthy and "give it as --prefill URL PORT" in (w.problem or "")
    async with aiohttp.ClientSession() as s:
        for _ in range(2):
            async with s.post(router.url + "/v1/chat/completions", json=CHAT) as resp:
                assert resp.headers["x-smetric-prefill-worker"] == good.url
    assert mute.bodies == []


@pytest.mark.parametrize("decode_policy", ["least_tokens", "round_robin"])
async def test_decode_policy_sees_tokens_in_use(
    make_worker: MakeWorker, make_router: MakeRouter, decode_policy: str
) -> None:
    pd = await start_pd(
        make_worker, make_router, prefills=1, decode_policy=decode_policy,
        load_poll_interval_secs=0.05,
    )  # fmt: skip
    busy, idle = pd.decodes
    busy.used_tokens = 100_000  # another router's long contexts
    await pd.router.state.registry.poll_loads()
    assert pd.worker(busy.url).load(pd.worker(busy.url).reported_at, 1) == 100_000
    chosen = set()
    async with aiohttp.ClientSession() as s:
        for _ in range(3):
            async with s.post(pd.url + "/v1/chat/completions", json=CHAT) as resp:
                chosen.add(resp.headers["x-smetric-worker"])
    assert chosen == ({idle.url} if decode_policy == "least_tokens" else {busy.url, idle.url})
