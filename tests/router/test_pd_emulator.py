"""The PD router against emulated prefill and decode workers: the real handover, KV events,
/server_info bootstrap port discovery and the decode's KV timeout."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import orjson
from aiohttp.test_utils import TestServer

from smetric_router.router.app import RUNNER_OPTIONS, RouterState, build_app
from smetric_router.router.assemble import make_state
from smetric_router.router.config import RouterConfig
from tests.emulator.conftest import MODEL, Worker, make_config, serving
from tests.helpers.polling import eventually

KV_TIMEOUT_S = 0.5


@contextlib.asynccontextmanager
async def pd_stack(prefills: int) -> AsyncIterator[tuple[list[Worker], Worker, RouterState, str]]:
    async with contextlib.AsyncExitStack() as stack:
        ps = [
            await stack.enter_async_context(serving(make_config(role="prefill")))
            for _ in range(prefills)
        ]
        d = await stack.enter_async_context(
            serving(make_config(role="decode", decode_kv_timeout_s=KV_TIMEOUT_S))
        )
        config = RouterConfig(
            pd_disaggregation=True,
            prefill=tuple((p.url, None) for p in ps),  # ports from /server_info
            decode_urls=(d.url,),
            health_check_interval_secs=60,
            load_poll_interval_secs=60,
            max_retries=0,
        )
        state = make_state(config)
        server = TestServer(build_app(state), host="127.0.0.1", **RUNNER_OPTIONS)
        await server.start_server()
        stack.push_async_callback(server.close)
        yield ps, d, state, f"http://127.0.0.1:{server.port}"


def released(state: RouterState) -> bool:
    return all((w.inflight, w.tokens) == (0, 0) for w in state.registry.workers.values())


async def test_follow_up_sticks_to_the_prefill_whose_kv_events_hold_it() -> None:
    async with pd_stack(2) as (ps, d, state, url):
        for p in ps:
            assert state.registry.workers[p.url].bootstrap_port == p.config.bootstrap_port
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        messages: list[Any] = [
            {"role": "system", "content": "You are a coding agent. " * 20},
            {"role": "user", "content": "List the files."},
        ]
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=8
        )
        first = raw.headers["x-smetric-prefill-worker"]
        assert raw.headers["x-smetric-worker"] == d.url
        answer = raw.parse().choices[0].message.content
        assert answer
        assert state.hits is not None
        hits = state.hits
        await eventually(lambda: hits.stats(first).gpu_pages > 0, "the first prompt's KV events")
        messages += [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "Open the README."},
        ]
        for _ in range(2):
            stream = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=messages, max_tokens=8, stream=True
            )
            assert stream.headers["x-smetric-prefill-worker"] == first
            assert stream.headers["x-smetric-reason"] == "sticky"
            text = "".join([c.choices[0].delta.content or "" async for c in stream.parse()])
            assert text
        await eventually(lambda: released(state), "every pair released")


async def test_prefill_withholding_its_kv_gives_the_client_an_error() -> None:
    async with pd_stack(1) as (ps, _, state, url):
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 4,
        }
        async with aiohttp.ClientSession() as s:
            for stream in (False, True):
                async with s.post(ps[0].url + "/emulator/faults", json={"withhold_kv_next": 1}):
                    pass
                async with s.post(
                    url + "/v1/chat/completions", json={**body, "stream": stream}
                ) as r:
                    raw = await r.read()
                if stream:  # a clean error event, then the end of the stream
                    assert r.status == 200 and raw.endswith(b"data: [DONE]\n\n")
                    assert b'"error"' in raw and b"KV transfer timed out" in raw
                else:
                    assert r.status == 500
                    assert "KV transfer timed out" in orjson.loads(raw)["error"]["message"]
            # The fault is spent: the next request is served.
            async with s.post(url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200
        await eventually(lambda: released(state), "every pair released")
