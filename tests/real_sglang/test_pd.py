"""The router over a real SGLang 0.5.23 prefill and decode pair (CPU, tiny random model).

One prefill and one decode `launch_server` (--disaggregation-mode, mooncake_tcp: the KV really
moves over Mooncake's TCP transport) behind the router in PD mode, started by the launcher for
this module. What is checked is SGLang's own: cached tokens, KV events, /v1/loads, the bootstrap
handshake. To hold a request before the handover, the decode's scheduler is paused (SIGSTOP): its
HTTP server takes the request, but it never handshakes with the prefill, so the prefill keeps the
request in its bootstrap queue. The tests run in definition order; the last one kills the prefill.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from smetric_router.launch import (
    ClusterSpec,
    PdSpec,
    RouterSpec,
    SglangSpec,
    Stack,
    WorkerSpec,
)
from tests.helpers.polling import eventually
from tests.real_sglang.conftest import (
    MAX_TOTAL_TOKENS,
    MODEL,
    ROUTER_ARGS,
    flush,
    require_sglang_env,
)

pytestmark = pytest.mark.sglang

PAGE = 16
SYSTEM = "You are a coding agent. You read files, run tools and edit code until the task is done. "
# health checks every second: a dead prefill is excluded quickly
PD_ROUTER_ARGS = (*ROUTER_ARGS, "--health-check-interval-secs", "1")


def pd_spec() -> ClusterSpec:
    return ClusterSpec(
        router=RouterSpec(port=0, extra_args=PD_ROUTER_ARGS),
        workers=WorkerSpec(kind="sglang", page_size=PAGE),
        pd=PdSpec(prefill=1, decode=1),
        sglang=SglangSpec(max_total_tokens=MAX_TOTAL_TOKENS),
    )


@pytest.fixture(scope="module")
def pd_stack() -> Iterator[Stack]:
    """1 real SGLang prefill + 1 decode + the router in PD mode (start: ~1 min)."""
    require_sglang_env()
    with Stack(pd_spec()) as stack:
        yield stack


def _url(stack: Stack, role: str) -> str:
    return next(w.url for w in stack.workers if w.role == role)


def _pgid(stack: Stack, role: str) -> int:
    """The process group of a worker: its launcher process and the processes SGLang spawned."""
    url = _url(stack, role)
    child = next(c for c in stack.children if c.ready_url.startswith(url))
    assert child.proc is not None and child.proc.poll() is None
    return child.proc.pid  # started with start_new_session: pid == pgid


def _scheduler_pid(pgid: int) -> int:
    """SGLang's scheduler process in that group (its process title is sglang::scheduler)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            # /proc/PID/stat: "pid (comm) state ppid pgrp ..."; comm may hold spaces
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (entry / "cmdline").read_bytes()
            if int(fields[2]) == pgid and cmd.startswith(b"sglang::scheduler"):
                return int(entry.name)
    raise AssertionError(f"no sglang::scheduler in process group {pgid}")


@contextlib.contextmanager
def decode_paused(stack: Stack) -> Iterator[None]:
    """The decode's scheduler stopped: requests reach its HTTP server, no handshake happens."""
    pid = _scheduler_pid(_pgid(stack, "decode"))
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


async def _get(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url, timeout=aiohttp.ClientTimeout(total=10)) as r:
        return await r.json()


async def _router_worker(http: aiohttp.ClientSession, stack: Stack, url: str) -> dict[str, Any]:
    listed = (await _get(http, stack.url + "/workers"))["workers"]
    worker: dict[str, Any] = next(w for w in listed if w["url"] == url)
    return worker


async def _prefill_load(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    entry: dict[str, Any] = (await _get(http, url + "/v1/loads"))["loads"][0]
    return entry


def _chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **extra}


async def _post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, str, bytes]:
    async with http.post(url, json=body, timeout=aiohttp.ClientTimeout(total=120)) as r:
        return r.status, r.content_type, await r.read()


# --- a chat session through the PD pair --------------------------------------------------------


async def test_session_sticks_to_its_prefill_with_the_history_cached(pd_stack: Stack) -> None:
    """3 turns, the last one streamed: the decode answers, follow-ups stick to the prefill, and
    the prefill's cached tokens (SGLang's own, carried to the decode's reply) cover the history."""
    flush(pd_stack)
    prefill, decode = _url(pd_stack, "prefill"), _url(pd_stack, "decode")
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM * 2},
        {"role": "user", "content": "Reverse a linked list in Python."},
    ]
    history = 0
    async with AsyncOpenAI(base_url=f"{pd_stack.url}/v1", api_key="none",
                           max_retries=0) as client, aiohttp.ClientSession() as http:  # fmt: skip
        for turn in range(2):
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=messages, max_tokens=6
            )
            assert raw.headers["x-smetric-prefill-worker"] == prefill
            assert raw.headers["x-smetric-worker"] == decode
            assert raw.headers["x-smetric-reason"] == ("first-turn-balance", "sticky")[turn]
            reply = raw.parse()
            usage = reply.usage
            assert usage is not None and usage.completion_tokens == 6
            assert reply.choices[0].message.content
            details = usage.prompt_tokens_details
            assert details is not None and (details.cached_tokens or 0) >= history
            history = usage.prompt_tokens // PAGE * PAGE
            # the router's KV-event index: the prefill holds at least this prompt's full pages
            await eventually(
                partial(_holds, http, pd_stack, prefill, history), "prefill KV events seen"
            )
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            messages.append({"role": "user", "content": f"Tool result {turn}: 3 passed, 1 failed"})

        raw_stream = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=6, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        assert raw_stream.headers["x-smetric-prefill-worker"] == prefill
        assert raw_stream.headers["x-smetric-reason"] == "sticky"
        chunks = [c async for c in raw_stream.parse()]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = next(c.usage for c in chunks if c.usage)
    assert text and usage.completion_tokens == 6
    details = usage.prompt_tokens_details
    assert details is not None and (details.cached_tokens or 0) >= history > 0


async def _holds(http: aiohttp.ClientSession, stack: Stack, url: str, tokens: int) -> bool:
    pages = (await _router_worker(http, stack, url)).get("kv_pages") or {}
    return int(pages.get("gpu", 0)) * PAGE >= tokens


# --- the bootstrap queue: SGLang reports none of it, the router keeps counting it --------------


async def test_bootstrap_queue_stays_in_the_router_load(pd_stack: Stack) -> None:
    flush(pd_stack)
    prefill = _url(pd_stack, "prefill")
    body = _chat("Bootstrap " + "wait " * 120, max_tokens=4)
    async with aiohttp.ClientSession() as http:
        with decode_paused(pd_stack):
            request = asyncio.create_task(_post(http, pd_stack.url + "/v1/chat/completions", body))

            async def in_bootstrap() -> dict[str, Any] | None:
                entry = await _prefill_load(http, prefill)
                return entry if entry["disaggregation"]["prefill_bootstrap_queue_reqs"] else None

            entry = await eventually(in_bootstrap, "the request in the prefill's bootstrap queue")
            assert entry["num_waiting_uncached_tokens"] == 0  # SGLang leaves it out
            seen = await _router_worker(http, pd_stack, prefill)
            since = time.monotonic()
            while time.monotonic() - since < 1.0:  # a few fresh polls (every 0.2 s) of 0
                seen = await _router_worker(http, pd_stack, prefill)
                assert seen["tokens"] > 100 and seen["load"] >= seen["tokens"], seen
                await asyncio.sleep(0.1)
            assert seen["reported_load"] == 0, seen
        status, _, raw = await request  # the decode resumes: handshake, transfer, decode
        assert status == 200, raw
        assert json.loads(raw)["usage"]["completion_tokens"] == 4
        done = await _router_worker(http, pd_stack, prefill)
        assert done["tokens"] == 0


# --- the prefill dies before the handover (last: it takes the only prefill away) ---------------


async def test_prefill_killed_before_the_handover_gives_a_clean_error(pd_stack: Stack) -> None:
    prefill = _url(pd_stack, "prefill")
    body = _chat("Doomed " + "turn " * 40, max_tokens=4, stream=True)
    async with aiohttp.ClientSession() as http:
        with decode_paused(pd_stack):
            request = asyncio.create_task(_post(http, pd_stack.url + "/v1/chat/completions", body))

            async def in_bootstrap() -> bool:
                entry = await _prefill_load(http, prefill)
                return bool(entry["disaggregation"]["prefill_bootstrap_queue_reqs"])

            await eventually(in_bootstrap, "the request in the prefill's bootstrap queue")
            os.killpg(_pgid(pd_stack, "prefill"), signal.SIGKILL)
            status, ctype, raw = await request
        # Nothing had reached the client: an OpenAI-style error, not a broken stream.
        assert status == 502 and ctype == "application/json", raw
        error = json.loads(raw)["error"]
        # It had accepted the request, so it may have run: not retried on another prefill.
        assert error["code"] == "worker_reset" and prefill in error["message"]

        async with http.get(pd_stack.url + "/health") as r:
            assert r.status == 200

        async def no_prefill() -> dict[str, Any] | None:
            small = _chat("Anyone there?", max_tokens=4)
            async with http.post(pd_stack.url + "/v1/chat/completions", json=small) as r:
                out: dict[str, Any] = await r.json()
                return out if r.status == 503 else None

        error = (await eventually(no_prefill, "a 503 once the prefill is excluded"))["error"]
        assert error["code"] == "no_worker_available", error
        async with http.get(pd_stack.url + "/readiness") as r:
            assert r.status == 503
