"""The router's upstream hardening, through HTTP against an in-process router: a worker that drops
a request it accepted, the router's own file-descriptor shortage and its connection bound, hung
and stalled workers, worker error shapes and cut streams in the metrics."""

from __future__ import annotations

import asyncio
import errno
import time
from typing import Any

import aiohappyeyeballs
import aiohttp
import orjson
import pytest
from aiohttp import web

from tests.helpers.polling import eventually
from tests.router.conftest import MakeRouter, MakeWorker, RouterUnderTest
from tests.router.fakes import DroppingWorker, FakeWorker

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
CHAT = {"model": "fake-model", "messages": MESSAGES}
STREAM = {"text": "hello", "stream": True}


class SilentStreamWorker(FakeWorker):
    """Sends its stream's head at once (as SGLang does), then nothing until `release`."""

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.json())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await self.release.wait()
        await resp.write(b'data: {"text":"a"}\n\ndata: [DONE]\n\n')
        return resp


class SglangErrorWorker(FakeWorker):
    """Refuses every generation request in SGLang's own error shape (its OpenAI endpoints')."""

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.json())
        body = {"object": "error", "message": "max_tokens is too large", "type": "BadRequestError",
                "param": "max_tokens", "code": 400}  # fmt: skip
        return web.json_response(body, status=400)


async def _workers(router: RouterUnderTest) -> dict[str, dict[str, Any]]:
    async with aiohttp.ClientSession() as s, s.get(router.url + "/workers") as resp:
        return {w["url"]: w for w in (await resp.json())["workers"]}


async def _metrics(router: RouterUnderTest) -> str:
    async with aiohttp.ClientSession() as s, s.get(router.url + "/metrics") as resp:
        return await resp.text()


class NoDescriptors:
    """Connections to the given workers fail as socket() does when the router has no file
    descriptor left: the proxy's own client (loop.create_connection) and aiohttp's (PD, health
    checks), while the router's listener and the test's client keep working."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, urls: set[str]) -> None:
        self.ports = {int(u.rsplit(":", 1)[1]) for u in urls}
        self.on = True
        loop = asyncio.get_running_loop()
        real_loop, real_eyeballs = loop.create_connection, aiohappyeyeballs.start_connection

        async def loop_connect(*args: Any, **kw: Any) -> Any:
            self._check(args[2] if len(args) > 2 else kw.get("port"))
            return await real_loop(*args, **kw)

        async def aiohttp_connect(addr_infos: Any, **kw: Any) -> Any:
            self._check(addr_infos[0][4][1])
            return await real_eyeballs(addr_infos, **kw)

        monkeypatch.setattr(loop, "create_connection", loop_connect)
        monkeypatch.setattr(aiohappyeyeballs, "start_connection", aiohttp_connect)

    def _check(self, port: object) -> None:
        if self.on and port in self.ports:
            raise OSError(errno.EMFILE, "Too many open files")

    def lift(self) -> None:
        self.on = False


# a worker that died after accepting the request ---------------------------------------------


@pytest.mark.parametrize("retry_on_reset", [False, True])
async def test_request_dropped_after_it_was_sent_is_retried_only_when_asked(
    make_worker: MakeWorker, make_router: MakeRouter, retry_on_reset: bool
) -> None:
    budget = [1]  # whichever worker gets the first request drops it
    a = await make_worker("a", cls=DroppingWorker, budget=budget)
    b = await make_worker("b", cls=DroppingWorker, budget=budget)
    router = await make_router([a.url, b.url], retry_on_reset=retry_on_reset)
    async with aiohttp.ClientSession() as s, s.post(router.url + "/generate", json=STREAM) as r:
        status, raw = r.status, await r.read()
    dropped_by = a if a.bodies else b
    other = b if dropped_by is a else a
    if retry_on_reset:
        assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
        assert len(other.bodies) == 1  # sent on, as asked
        assert f'smetric_retries_total{{worker="{dropped_by.url}"}} 1.0' in await _metrics(router)
    else:
        assert status == 502
        assert orjson.loads(raw)["error"]["code"] == "worker_reset"
        assert other.bodies == []  # never sent to a second worker
    assert len(dropped_by.bodies) == 1
    # The worker that dropped it is out until a health check passes.
    assert (await _workers(router))[dropped_by.url]["healthy"] is False
    assert all(w["inflight"] == 0 for w in (await _workers(router)).values())


# the router's own file-descriptor shortage ---------------------------------------------------


async def test_fd_exhaustion_is_503_and_no_worker_is_marked_down(
    make_worker: MakeWorker, make_router: MakeRouter, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = await make_worker("a"), await make_worker("b")
    router = await make_router([a.url, b.url])
    shortage = NoDescriptors(monkeypatch, {a.url, b.url})
    async with aiohttp.ClientSession() as s:
        for body in (CHAT, {**CHAT, "stream": True}):
            async with s.post(router.url + "/v1/chat/completions", json=body) as r:
                assert r.status == 503
                assert r.headers["Retry-After"] == "1"
                err = (await r.json())["error"]
                assert err["code"] == "router_overloaded"
                assert "Too many open files" in err["message"]
        await router.state.registry.check_health()  # a health round in the shortage
        assert all(w["healthy"] for w in (await _workers(router)).values())
        shortage.lift()
        async with s.post(router.url + "/v1/chat/completions", json=CHAT) as r:
            assert r.status == 200
    assert a.bodies == [] or b.bodies == []  # only the last request reached a worker
    assert len(a.bodies) + len(b.bodies) == 1
    assert "smetric_retries_total{" not in await _metrics(router)


async def test_requests_past_the_connection_bound_wait_for_a_free_one(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    w = await make_worker("a")
    w.hold_stream = True  # the first stream holds the only connection
    router = await make_router([w.url], max_upstream_connections=1, first_byte_timeout_secs=30)
    async with aiohttp.ClientSession() as s:
        first = await s.post(router.url + "/generate", json=STREAM)
        await first.content.readuntil(b"\n\n")
        second = asyncio.create_task(s.post(router.url + "/generate", json=STREAM))
        await eventually(
            lambda: router.state.proxy.upstream.waiting() == 1,
            "the second request waiting for a slot",
        )
        assert len(w.bodies) == 1  # the second waits in the router, not at the worker
        w.release.set()
        assert (await first.read()).endswith(b"data: [DONE]\n\n")
        first.release()
        resp = await second
        assert resp.status == 200 and (await resp.read()).endswith(b"data: [DONE]\n\n")
    assert len(w.bodies) == 2


async def test_waiting_for_a_connection_past_the_first_byte_bound_is_503(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    w = await make_worker("a")
    w.hold_stream = True
    router = await make_router([w.url], max_upstream_connections=1, first_byte_timeout_secs=0.3)
    async with aiohttp.ClientSession() as s:
        first = await s.post(router.url + "/generate", json=STREAM)
        await first.content.readuntil(b"\n\n")
        async with s.post(router.url + "/generate", json=STREAM) as r:
            assert r.status == 503
            assert (await r.json())["error"]["code"] == "router_overloaded"
        assert len(w.bodies) == 1
        w.release.set()
        assert (await first.read()).endswith(b"data: [DONE]\n\n")
        first.release()
    assert (await _workers(router))[w.url]["healthy"] is True  # its worker did nothing wrong


# hung and stalled workers --------------------------------------------------------------------


async def test_worker_hung_before_its_head_is_504_and_marked_failed(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    w = await make_worker("a")
    w.stall = True
    router = await make_router([w.url], first_byte_timeout_secs=0.4)
    started = time.monotonic()
    async with aiohttp.ClientSession() as s, s.post(router.url + "/generate", json=STREAM) as r:
        assert r.status == 504
        err = (await r.json())["error"]
    assert time.monotonic() - started < 5
    assert err["code"] == "worker_timeout" and err["type"] == "server_error"
    assert r.headers["x-smetric-worker"] == w.url
    assert (await _workers(router))[w.url]["healthy"] is False


async def test_worker_silent_after_its_head_ends_the_stream_cleanly(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    w = await make_worker("a", cls=SilentStreamWorker)
    router = await make_router([w.url], first_byte_timeout_secs=0.4)
    async with aiohttp.ClientSession() as s, s.post(router.url + "/generate", json=STREAM) as r:
        assert r.status == 200  # the head went out before the first token, as SGLang's does
        events = (await r.read()).split(b"\n\n")
    error = orjson.loads(events[0][len(b"data: ") :])["error"]
    assert error["code"] == "worker_timeout" and "0.4 s" in error["message"]
    assert events[1:] == [b"data: [DONE]", b""]
    assert (await _workers(router))[w.url]["healthy"] is False


async def test_stream_stalled_mid_way_ends_with_an_error_event_counted_as_error(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    w = await make_worker("a")
    w.hold_stream = True  # one chunk, then silence
    router = await make_router([w.url], stream_idle_timeout_secs=0.4)
    async with aiohttp.ClientSession() as s, s.post(router.url + "/generate", json=STREAM) as r:
        assert r.status == 200
        events = (await r.read()).split(b"\n\n")
    assert events[0] == b'data: {"text":"a"}'
    assert orjson.loads(events[1][len(b"data: ") :])["error"]["code"] == "worker_timeout"
    assert events[2:] == [b"data: [DONE]", b""]
    assert (await _workers(router))[w.url]["healthy"] is False
    metrics = await _metrics(router)
    assert 'smetric_requests_total{endpoint="/generate",status="stream_error"} 1.0' in metrics
    assert 'status="200"' not in metrics


async def test_long_non_streamed_answer_is_not_cut_by_the_first_byte_bound(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    # Its first byte is its whole answer: only the request timeout bounds it.
    w = await make_worker("a")
    w.stall = True
    router = await make_router([w.url], first_byte_timeout_secs=0.2, stream_idle_timeout_secs=0.2)
    async with aiohttp.ClientSession() as s:
        pending = asyncio.create_task(s.post(router.url + "/v1/chat/completions", json=CHAT))
        await eventually(lambda: len(w.bodies) == 1, "the worker holding the request")
        await asyncio.sleep(0.6)  # well past both bounds: the answer is still awaited
        assert not pending.done()
        w.release.set()
        resp = await pending
        assert resp.status == 200
        resp.release()
    assert (await _workers(router))[w.url]["healthy"] is True


async def test_non_streamed_request_on_a_hung_worker_ends_once_it_fails_health_checks(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    w = await make_worker("a")
    w.stall = True
    router = await make_router([w.url], first_byte_timeout_secs=0.2, health_check_interval_secs=0.1)
    async with aiohttp.ClientSession() as s:
        pending = asyncio.create_task(s.post(router.url + "/v1/chat/completions", json=CHAT))
        await eventually(lambda: len(w.bodies) == 1, "the worker holding the request")
        await asyncio.sleep(0.4)  # past the bound, but the worker passes its health checks
        assert not pending.done()
        w.healthy = False  # hung as SGLang hangs: its /health fails too
        started = time.monotonic()
        resp = await asyncio.wait_for(pending, 10)
        assert resp.status == 504
        err = (await resp.json())["error"]
        resp.release()
    assert time.monotonic() - started < 5
    assert err["code"] == "worker_timeout" and "health checks" in err["message"]


# compatibility: one error shape, cut streams counted as errors ---------------------------------


async def test_sglang_error_shape_is_rewritten_to_openais(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    w = await make_worker("a", cls=SglangErrorWorker)
    router = await make_router([w.url])
    async with aiohttp.ClientSession() as s:
        for body in (CHAT, {**CHAT, "stream": True}):
            async with s.post(router.url + "/v1/chat/completions", json=body) as r:
                assert r.status == 400 and r.content_type == "application/json"
                assert await r.json() == {
                    "error": {
                        "message": "max_tokens is too large",
                        "type": "BadRequestError",
                        "param": "max_tokens",
                        "code": None,
                    }
                }


async def test_stream_cut_by_a_lost_worker_is_counted_as_an_error(
    make_worker: MakeWorker, make_router: MakeRouter
) -> None:
    w = await make_worker("a")
    w.die_mid_stream_next = 1
    router = await make_router([w.url])
    async with aiohttp.ClientSession() as s:
        for _ in range(2):  # one cut, one whole
            async with s.post(router.url + "/generate", json=STREAM) as r:
                assert r.status == 200
                await r.read()
    metrics = await _metrics(router)
    assert 'smetric_requests_total{endpoint="/generate",status="stream_error"} 1.0' in metrics
    assert 'smetric_requests_total{endpoint="/generate",status="200"} 1.0' in metrics


# flags ------------------------------------------------------------------------------------------


def test_upstream_flags_reach_the_config_and_are_checked() -> None:
    from smetric_router.router.cli import build_parser, config_from_args
    from smetric_router.router.limits import AUTO_MAX, AUTO_MIN, upstream_connection_limit

    argv = ["--max-upstream-connections", "64", "--retry-on-reset",
            "--first-byte-timeout-secs", "90", "--stream-idle-timeout-secs", "30"]  # fmt: skip
    c = config_from_args(argv)
    assert (c.max_upstream_connections, c.retry_on_reset) == (64, True)
    assert (c.first_byte_timeout_secs, c.stream_idle_timeout_secs) == (90.0, 30.0)
    d = config_from_args([])
    assert (d.max_upstream_connections, d.retry_on_reset) == (0, False)
    # Long enough for a 100K-token prefill queued on a busy GPU, far below the 30-minute total.
    assert 60 <= d.first_byte_timeout_secs < d.request_timeout_secs
    assert 60 <= d.stream_idle_timeout_secs < d.request_timeout_secs
    assert upstream_connection_limit(64) == 64
    assert AUTO_MIN <= upstream_connection_limit(0) <= AUTO_MAX
    for bad in (["--max-upstream-connections", "-1"], ["--first-byte-timeout-secs", "0"],
                ["--stream-idle-timeout-secs", "-5"]):  # fmt: skip
        with pytest.raises(SystemExit):
            config_from_args(bad)
    help_text = " ".join(build_parser().format_help().split())
    assert "100K-token" in help_text and "--retry-on-reset" in help_text
