"""Forwarding through HTTP: decision headers, byte-exact replies, incremental streams, faults."""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import orjson
from aiohttp.test_utils import TestServer
from openai.types.chat import ChatCompletionMessageParam

from smetric_router.router.app import metrics_app
from tests.helpers.polling import eventually
from tests.router.conftest import MakeRouter, MakeWorker

MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hi"},
]


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


async def test_chat_reply_carries_decision_headers(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    a, b = await make_worker("a"), await make_worker("b")
    router = await make_router([a.url, b.url])
    raw = await client(router.url).chat.completions.with_raw_response.create(
        model="fake-model", messages=MESSAGES
    )
    chosen = raw.headers["x-smetric-worker"]
    assert chosen in (a.url, b.url)
    assert raw.headers["x-smetric-reason"] == "first-turn-balance"
    name = "a" if chosen == a.url else "b"
    assert raw.parse().choices[0].message.content == f"hello from {name}"
    assert raw.headers["x-fake"] == name  # worker headers pass through


async def test_non_streaming_reply_is_returned_unchanged(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    w = await make_worker("a")
    router = await make_router([w.url])
    body = {"text": "hello", "sampling_params": {"max_new_tokens": 4}}
    async with aiohttp.ClientSession() as s:
        async with s.post(w.url + "/generate", json=body) as direct:
            expected = await direct.read()
        async with s.post(router.url + "/generate", json=body) as resp:
            assert resp.status == 200
            assert resp.content_type == "application/json"
            assert await resp.read() == expected
            assert resp.headers["x-smetric-worker"] == w.url
        # A worker's own 4xx comes back as is, with the decision headers.
        bad = {"model": "fake-model", "prompt": "x", "max_tokens": 2}
        w.model = "other"
        async with s.post(router.url + "/v1/completions", json=bad) as resp:
            assert resp.status == 400
            assert (await resp.json()) == {"error": {"message": "bad model"}}
            assert resp.headers["x-smetric-worker"] == w.url


async def test_stream_passes_through_incrementally(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    w = await make_worker("a")
    w.hold_stream = True
    router = await make_router([w.url])
    body = {"model": "fake-model", "messages": MESSAGES, "stream": True}
    url = router.url + "/v1/chat/completions"
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as resp:
        assert resp.status == 200
        assert resp.headers["x-smetric-worker"] == w.url
        assert resp.headers["x-smetric-reason"] == "first-turn-balance"
        first = await resp.content.readuntil(b"\n\n")
        # The worker is still holding the stream open: the chunk came through on its own.
        assert not w.release.is_set()
        chunk = orjson.loads(first[len(b"data: ") :])
        assert chunk["choices"][0]["delta"]["content"] == "hello"
        w.release.set()
        rest = await resp.read()
    assert rest.endswith(b"data: [DONE]\n\n")
    assert b" from" in rest


async def test_openai_stream_through_router(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    w = await make_worker("a")
    router = await make_router([w.url])
    stream = await client(router.url).chat.completions.create(
        model="fake-model", messages=MESSAGES, stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream])
    assert text == "hello from a"


async def test_refused_connection_is_retried_on_another_worker(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    a, b = await make_worker("a"), await make_worker("b")
    router = await make_router([a.url, b.url])
    dead = a.url
    await a.close()  # still registered as healthy: the next dispatch to it is refused
    served = set()
    async with aiohttp.ClientSession() as s:
        for _ in range(4):
            body = {"text": "hello", "sampling_params": {"max_new_tokens": 2}}
            async with s.post(router.url + "/generate", json=body) as resp:
                assert resp.status == 200
                served.add(resp.headers["x-smetric-worker"])
        async with s.get(router.url + "/metrics") as resp:
            metrics = await resp.text()
        async with s.get(router.url + "/workers") as resp:
            listed = {w["url"]: w for w in (await resp.json())["workers"]}
    assert served == {b.url}
    assert f'smetric_retries_total{{worker="{dead}"}} 1.0' in metrics
    assert listed[dead]["healthy"] is False  # excluded until a health check passes
    assert listed[dead]["inflight"] == 0 and listed[b.url]["inflight"] == 0


async def test_5xx_before_first_byte_is_retried(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    a, b = await make_worker("a"), await make_worker("b")
    a.fail_next = 1
    router = await make_router([a.url, b.url])
    served = []
    async with aiohttp.ClientSession() as s:
        for _ in range(3):  # round-robin ties: a is asked within the first two
            body = {"model": "fake-model", "messages": MESSAGES}
            async with s.post(router.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                served.append(resp.headers["x-smetric-worker"])
        async with s.get(router.url + "/metrics") as resp:
            metrics = await resp.text()
    assert a.fail_next == 0
    assert f'smetric_retries_total{{worker="{a.url}"}} 1.0' in metrics
    assert len(b.bodies) + len(a.bodies) == 4  # three answers plus the refused attempt
    assert router.state.registry.workers[a.url].healthy  # a 5xx alone does not exclude


async def test_last_try_returns_the_workers_own_5xx(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    a, b = await make_worker("a"), await make_worker("b")
    a.fail_next = b.fail_next = 10
    router = await make_router([a.url, b.url], max_retries=1)
    async with aiohttp.ClientSession() as s:
        body = {"model": "fake-model", "messages": MESSAGES}
        async with s.post(router.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 503
            # The worker's message, in OpenAI's error shape (as every error the client sees).
            assert (await resp.json())["error"]["message"] == "injected"
            assert resp.headers["x-smetric-worker"] in (a.url, b.url)
    assert len(a.bodies) == len(b.bodies) == 1  # one try each, then the answer as it was


async def test_no_reachable_worker_is_502(make_worker: MakeWorker, make_router: MakeRouter) -> None:
    a = await make_worker("a")
    router = await make_router([a.url])
    dead = a.url
    await a.close()
    async with aiohttp.ClientSession() as s:
        body = {"model": "fake-model", "messages": MESSAGES}
        async with s.post(router.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 502
            err = (await resp.json())["error"]
            assert err["code"] == "worker_unavailable" and dead in err["message"]
            assert resp.headers["x-smetric-worker"] == dead


async def test_worker_lost_mid_stream_ends_with_error_then_done(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    w = await make_worker("a")
    w.die_mid_stream_next = 1
    router = await make_router([w.url])
    body = {"text": "hello", "stream": True}
    async with aiohttp.ClientSession() as s:
        async with s.post(router.url + "/generate", json=body) as resp:
            assert resp.status == 200
            events = (await resp.read()).split(b"\n\n")
        assert events[0] == b'data: {"text":"a"}'
        assert orjson.loads(events[1][len(b"data: ") :])["error"]["code"] == "worker_lost"
        assert events[2:] == [b"data: [DONE]", b""]
        # The router keeps serving.
        async with s.post(router.url + "/generate", json=body) as resp:
            assert (await resp.read()).endswith(b"data: [DONE]\n\n")
    await eventually(
        lambda: router.state.registry.workers[w.url].inflight == 0,
        "the router's in-flight count back to 0",
    )


async def test_worker_lost_after_its_done_event_leaves_the_stream_complete(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    # Found by the soak (benchmarks/soak.py): a worker killed between its [DONE] and the end of
    # the chunked body made the router append an error event and a second [DONE].
    w = await make_worker("a")
    w.die_after_done_next = 1
    router = await make_router([w.url])
    async with aiohttp.ClientSession() as s:
        url = router.url + "/generate"
        async with s.post(url, json={"text": "hello", "stream": True}) as resp:
            raw = await resp.read()
    events = [e for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]" and events.count(b"data: [DONE]") == 1
    assert all(b'"error"' not in e for e in events)


async def test_client_leaving_mid_stream_releases_the_worker(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    w = await make_worker("a")
    w.hold_stream = True
    router = await make_router([w.url])
    worker = router.state.registry.workers[w.url]
    body = {"text": "hello", "stream": True}
    async with aiohttp.ClientSession() as s:
        resp = await s.post(router.url + "/generate", json=body)
        await resp.content.readuntil(b"\n\n")
        assert worker.inflight == 1
        resp.close()  # the client goes away while the worker still streams
    await eventually(lambda: worker.inflight == 0, "the worker's in-flight count back to 0")
    async with aiohttp.ClientSession() as s:
        w.hold_stream = False
        async with s.post(router.url + "/generate", json=body) as resp:
            assert (await resp.read()).endswith(b"data: [DONE]\n\n")


async def test_worker_lost_mid_event_still_yields_a_parseable_error_event(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    w = await make_worker("a")
    w.die_mid_stream_next, w.cut_event = 1, True
    router = await make_router([w.url])
    url = router.url + "/generate"
    async with aiohttp.ClientSession() as s, s.post(url, json={"text": "x", "stream": True}) as r:
        events = (await r.read()).split(b"\n\n")
    assert events[1] == b'data: {"t'  # the half event, closed off on its own
    assert orjson.loads(events[2][len(b"data: ") :])["error"]["code"] == "worker_lost"
    assert events[3:] == [b"data: [DONE]", b""]


async def test_stalled_worker_times_out_with_504(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    a = await make_worker("a")
    a.stall = True
    router = await make_router([a.url], request_timeout_secs=0.3)
    url = router.url + "/generate"
    async with aiohttp.ClientSession() as s, s.post(url, json={"text": "x"}) as resp:
        assert resp.status == 504
        assert (await resp.json())["error"]["code"] == "worker_timeout"
        assert resp.headers["x-smetric-worker"] == a.url
    assert router.state.registry.workers[a.url].inflight == 0


async def test_no_response_names_the_server_or_its_versions(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    # aiohttp's default is `Server: Python/3.x aiohttp/3.x` (the fake worker still sends it).
    w = await make_worker("a")
    router = await make_router([w.url])
    chat = {"model": "fake-model", "messages": MESSAGES}
    asks: list[tuple[str, str, Any]] = [
        ("POST", "/v1/chat/completions", chat),  # a worker's reply, relayed
        ("POST", "/v1/chat/completions", {**chat, "stream": True}),  # streamed
        ("POST", "/v1/chat/completions", {"messages": 3}),  # the router's own 400
        ("GET", "/health", None),
        ("GET", "/metrics", None),
        ("GET", "/workers", None),
        ("GET", "/nowhere", None),  # the catch-all's 404
        ("DELETE", "/v1/models", None),  # and its 405
    ]
    metrics = TestServer(metrics_app(router.state), host="127.0.0.1")
    await metrics.start_server()
    try:
        asks += [("GET", f"http://127.0.0.1:{metrics.port}/metrics", None)]
        async with aiohttp.ClientSession() as s:
            async with s.get(w.url + "/health") as direct:
                assert direct.headers["Server"].startswith("Python/")  # what is dropped
            for method, path, body in asks:
                url = path if path.startswith("http") else router.url + path
                async with s.request(method, url, json=body) as r:
                    await r.read()
                    assert "Server" not in r.headers, (method, path, r.headers["Server"])
    finally:
        await metrics.close()
