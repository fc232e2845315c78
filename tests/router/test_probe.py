"""--cache-view probe against emulated workers: hits come from each worker's
POST /smetric/prefix_match (the patched SGLang endpoint), with KV events off."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from smetric_router.features.budget import UNLIMITED, Budget
from smetric_router.features.chat_tokenizer import load_chat_tokenizer
from smetric_router.features.extract import FeatureExtractor
from smetric_router.router.app import RUNNER_OPTIONS, RouterState, build_app
from smetric_router.router.assemble import make_state
from smetric_router.router.cli import config_from_args
from smetric_router.router.config import RouterConfig
from tests.emulator.conftest import MODEL, Worker, make_config, serving

SYSTEM = {"role": "system", "content": "You are a coding agent. " * 20}


class CountingExtractor(FeatureExtractor):
    """Counts prompt tokenizations, which only probe mode may pay for."""

    calls = 0

    def prompt_token_ids(self, body: Mapping[str, Any], budget: Budget = UNLIMITED) -> list[int]:
        CountingExtractor.calls += 1
        return super().prompt_token_ids(body, budget)


@contextlib.asynccontextmanager
async def stack(
    cache_view: str, counting: bool = False, probe_timeout_secs: float = 10.0
) -> AsyncIterator[tuple[list[Worker], RouterState, aiohttp.ClientSession, str]]:
    async with contextlib.AsyncExitStack() as s:
        workers = [await s.enter_async_context(serving(make_config())) for _ in range(2)]
        config = RouterConfig(
            worker_urls=tuple(w.url for w in workers),
            health_check_interval_secs=60,
            load_poll_interval_secs=60,
            kv_events=False,  # --no-kv-events: only the probe can see the caches,
            inflight_prefixes=False,  # not the router's own record of where prompts went
            cache_view=cache_view,
            # generous unless a test is about the timeout: a loaded machine answers slowly
            probe_timeout_secs=probe_timeout_secs,
        )
        state = make_state(config)
        if counting:
            chat = load_chat_tokenizer()
            state.features_for = lambda page: CountingExtractor(chat, page_size=page)
        server = TestServer(build_app(state), host="127.0.0.1", **RUNNER_OPTIONS)
        await server.start_server()
        s.push_async_callback(server.close)
        http = await s.enter_async_context(aiohttp.ClientSession())
        yield workers, state, http, f"http://127.0.0.1:{server.port}"


async def chat(http: aiohttp.ClientSession, url: str, messages: list[Any]) -> tuple[str, str, str]:
    """(worker, reason, answer) of one non-streamed chat completion through the router."""
    body = {"model": MODEL, "messages": messages, "max_tokens": 8}
    async with http.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        answer = (await r.json())["choices"][0]["message"]["content"]
        return r.headers["x-smetric-worker"], r.headers["x-smetric-reason"], answer


def follow_up(messages: list[Any], answer: str, text: str) -> list[Any]:
    return [*messages, {"role": "assistant", "content": answer}, {"role": "user", "content": text}]


async def test_follow_up_sticks_by_probe_with_kv_events_off() -> None:
    async with stack("probe") as (_, state, http, url):
        assert state.hits is None and state.kv_feeds is None
        messages = [SYSTEM, {"role": "user", "content": "List the files."}]
        first, reason, answer = await chat(http, url, messages)
        assert reason == "first-turn-balance"
        for text in ("Open the README.", "Now run the tests."):
            messages = follow_up(messages, answer, text)
            worker, reason, answer = await chat(http, url, messages)
            assert (worker, reason) == (first, "sticky")
        failures = state.metrics.registry.get_sample_value(
            "smetric_probe_failures_total", {"worker": first, "outcome": "timeout"}
        )
        assert failures is None


async def test_probe_timeout_counts_as_no_hit_and_balances() -> None:
    async with stack("probe", probe_timeout_secs=0.1) as (workers, state, http, url):
        messages = [SYSTEM, {"role": "user", "content": "List the files."}]
        first, _, answer = await chat(http, url, messages)
        holder = next(w for w in workers if w.url == first)
        status, _ = await holder.post("/emulator/faults", {"probe_delay_secs": 2.0})
        assert status == 200
        _, reason, _ = await chat(http, url, follow_up(messages, answer, "Open the README."))
        # The holder's hit is unknown in time, the other holds nothing: the KV looks evicted.
        assert reason == "evicted-fallback"
        failures = state.metrics.registry.get_sample_value(
            "smetric_probe_failures_total", {"worker": first, "outcome": "timeout"}
        )
        assert failures == 1


@pytest.mark.parametrize(("cache_view", "tokenizations"), [("events", 0), ("probe", 1)])
async def test_only_probe_mode_tokenizes_the_prompt(cache_view: str, tokenizations: int) -> None:
    async with stack(cache_view, counting=True) as (_, _, http, url):
        CountingExtractor.calls = 0
        await chat(http, url, [SYSTEM, {"role": "user", "content": "List the files."}])
        assert CountingExtractor.calls == tokenizations


def test_cli_cache_view_flags(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--worker-urls", "http://127.0.0.1:1"]
    assert config_from_args(base).cache_view == "events"
    config = config_from_args([*base, "--cache-view", "probe", "--probe-timeout-secs", "0.2"])
    assert (config.cache_view, config.probe_timeout_secs) == ("probe", 0.2)
    for bad, said in (
        (["--cache-view", "index"], "invalid choice: 'index'"),
        (["--probe-timeout-secs", "0"], "probe_timeout_secs must be > 0"),
    ):
        with pytest.raises(SystemExit):
            config_from_args([*base, *bad])
        assert said in capsys.readouterr().err
