"""Token limits and huge prompts through a launched stack (emulated workers serving a 32K
context, reported by their /v1/models as SGLang does): the router refuses a completion budget or
a prompt past the context with an OpenAI-style 400 before any worker sees it, refuses an
8M-character prompt after tokenizing a prefix, off the event loop, while /health keeps
answering, and keeps its memory."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from smetric_router.features.chat_tokenizer import load_chat_tokenizer
from smetric_router.features.sample_text import TextSampler
from smetric_router.launch import ClusterSpec, RouterSpec, Stack, WorkerSpec
from tests.e2e.conftest import ROUTER_ARGS, SPEEDUP

CONTEXT = 32768
MODEL = WorkerSpec().model_name
MB = 1 << 20


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    spec = ClusterSpec(
        router=RouterSpec(port=0, extra_args=ROUTER_ARGS),
        workers=WorkerSpec(count=2, speedup=SPEEDUP, extra_args=("--context-length", str(CONTEXT))),
    )
    with Stack(spec) as s:
        yield s


def router_pid(stack: Stack) -> int:
    (router,) = [c for c in stack.children if c.name == "router"]
    assert router.proc is not None
    return router.proc.pid


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def words_text(chars: int, seed: int) -> str:
    words = [w for _, w in TextSampler(load_chat_tokenizer().tokenizer.backend).words()[:4000]]
    rnd = random.Random(seed)
    pieces, n = [], 0
    while n < chars:
        w = rnd.choice(words)
        pieces.append(w)
        n += len(w)
    return "".join(pieces)[:chars]


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, Any, Any]:
    async with http.post(url, json=body) as r:
        return r.status, await r.json(content_type=None), r.headers


def refused(status: int, body: Any, headers: Any, param: str, code: str | None) -> str:
    """The router's own 400, in OpenAI's shape, with no worker involved."""
    assert status == 400, body
    assert "x-smetric-worker" not in headers
    err = body["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert err["code"] == code
    return str(err["message"])


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Write a haiku."}]}


async def test_completion_budgets_past_the_context_are_refused(stack: Stack) -> None:
    paths = ("/v1/chat/completions", "/v1/completions", "/generate")
    chat, completions, generate = (f"{stack.url}{p}" for p in paths)
    too_large = "context_length_exceeded"
    async with aiohttp.ClientSession() as http:
        msg = refused(*await post(http, chat, {**CHAT, "max_tokens": 1e9}), "max_tokens", too_large)
        assert msg == (
            "max_tokens is too large: 1000000000. This model supports at most 32768 completion "
            "tokens."
        )
        refused(
            *await post(http, chat, {**CHAT, "max_completion_tokens": CONTEXT + 1}),
            "max_completion_tokens",
            too_large,
        )
        prompt = {"model": MODEL, "prompt": "Hi", "max_tokens": 10**9}
        refused(*await post(http, completions, prompt), "max_tokens", too_large)
        big = {"text": "Hi", "sampling_params": {"max_new_tokens": 2**40}}
        refused(*await post(http, generate, big), "max_new_tokens", too_large)
        # within the context alone, past it with the prompt: SGLang's total check
        msg = refused(
            *await post(http, chat, {**CHAT, "max_tokens": CONTEXT}), "max_tokens", too_large
        )
        assert msg.startswith(
            "Requested token count exceeds the model's maximum context length of 32768 tokens. "
        )
        for bad in (-1, 1.5, "64", True):
            msg = refused(*await post(http, chat, {**CHAT, "max_tokens": bad}), "max_tokens", None)
            assert msg == "Invalid 'max_tokens': expected a non-negative integer."
        refused(
            *await post(http, chat, {**CHAT, "max_completion_tokens": -2}),
            "max_completion_tokens",
            None,
        )
        bad_generate = {"text": "Hi", "sampling_params": {"max_new_tokens": -5}}
        refused(*await post(http, generate, bad_generate), "sampling_params.max_new_tokens", None)
        # what fits is served
        status, body, _ = await post(http, chat, {**CHAT, "max_tokens": 8, "ignore_eos": True})
        assert status == 200 and body["usage"]["completion_tokens"] == 8
        status, body, _ = await post(
            http,
            generate,
            {"text": "Hi", "sampling_params": {"max_new_tokens": 4.0, "ignore_eos": True}},
        )
        assert status == 200 and body["meta_info"]["completion_tokens"] == 4


async def test_a_prompt_at_the_context_is_refused_and_one_below_served(stack: Stack) -> None:
    url = f"{stack.url}/generate"
    async with aiohttp.ClientSession() as http:
        msg = refused(
            *await post(http, url, {"input_ids": [7] * CONTEXT}),
            "input_ids",
            "context_length_exceeded",
        )
        assert msg == (
            "The input (32768 tokens) is longer than the model's context length (32768 tokens)."
        )
        # ~6K tokens of text: tokenized off the loop (over INLINE_CHARS), then served
        text = words_text(40_000, seed=1)
        served = {"text": text, "sampling_params": {"max_new_tokens": 2}}
        status, body, headers = await post(http, url, served)
        assert status == 200, body
        assert headers["x-smetric-worker"] in stack.worker_urls


async def test_an_8m_character_prompt_is_refused_while_health_answers(stack: Stack) -> None:
    pid = router_pid(stack)
    text = words_text(8_000_000, seed=2)
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 8}
    async with aiohttp.ClientSession() as http:
        status, _, _ = await post(http, f"{stack.url}/v1/chat/completions", CHAT)
        assert status == 200
        before = rss(pid)
        big = asyncio.create_task(post(http, f"{stack.url}/v1/chat/completions", body))
        latencies = []
        while not big.done():
            started = time.monotonic()
            async with http.get(f"{stack.url}/health") as r:
                assert r.status == 200
            latencies.append(time.monotonic() - started)
            await asyncio.sleep(0.02)
        status, answer, headers = await big
        after = rss(pid)
    msg = refused(status, answer, headers, "messages", "context_length_exceeded")
    assert msg.startswith("The input (at least ")
    assert msg.endswith(" tokens) is longer than the model's context length (32768 tokens).")
    assert len(latencies) >= 3, "the prompt was refused before /health was asked"
    assert max(latencies) < 0.5, f"/health took {max(latencies):.2f} s meanwhile"
    # the body and its text come and go; nothing of the prompt is kept
    assert after - before < 200 * MB, f"RSS {before / MB:.0f} -> {after / MB:.0f} MB"
