"""The openai client through a launched PD stack: emulated prefill and decode instances behind the
router in --pd-disaggregation mode, chat completions streaming and not."""

from __future__ import annotations

from collections.abc import Iterator

import aiohttp
import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from smetric_router.launch import ClusterSpec, PdSpec, RouterSpec, Stack, WorkerSpec
from tests.e2e.conftest import ROUTER_ARGS, SPEEDUP
from tests.e2e.raw import listed_workers
from tests.helpers.polling import eventually


@pytest.fixture(scope="module")
def pd_stack() -> Iterator[Stack]:
    spec = ClusterSpec(
        router=RouterSpec(port=0, extra_args=ROUTER_ARGS),
        workers=WorkerSpec(speedup=SPEEDUP),
        pd=PdSpec(prefill=2, decode=1, decode_kv_timeout_secs=10.0),
    )
    with Stack(spec) as stack:
        yield stack


async def test_openai_client_chat_through_the_pd_stack(pd_stack: Stack) -> None:
    stack = pd_stack
    prefills = [w.url for w in stack.workers if w.role == "prefill"]
    decodes = [w.url for w in stack.workers if w.role == "decode"]
    model = stack.spec.workers.model_name
    async with AsyncOpenAI(base_url=f"{stack.url}/v1", api_key="none", max_retries=0) as client:
        messages: list[ChatCompletionMessageParam] = [
            {"role": "user", "content": "Explain prefill-decode disaggregation."}
        ]
        raw = await client.chat.completions.with_raw_response.create(
            model=model,
            messages=messages,
            max_tokens=12,
            extra_body={"ignore_eos": True},  # exactly 12 tokens, the last ending the turn
        )
        assert raw.headers["x-smetric-prefill-worker"] in prefills
        assert raw.headers["x-smetric-worker"] in decodes
        reply = raw.parse()
        answer = reply.choices[0].message.content
        assert answer and reply.choices[0].finish_reason == "stop"
        assert reply.usage is not None and reply.usage.completion_tokens == 12  # decode's answer

        stream = await client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=12,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        chunks = [c async for c in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert len(chunks) > 3 and text == answer  # same prompt, same answer

        # the follow-up carrying the answer is served too (the prefill side holds its history)
        follow: list[ChatCompletionMessageParam] = [
            *messages,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "Shorter, please."},
        ]
        raw = await client.chat.completions.with_raw_response.create(
            model=model,
            messages=follow,
            max_tokens=6,
        )
        assert raw.parse().choices[0].message.content


async def test_pd_follow_up_sticks_to_the_prefill_holding_its_history(pd_stack: Stack) -> None:
    stack = pd_stack
    model = stack.spec.workers.model_name
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "You are a coding agent working in a large repository."},
        {"role": "user", "content": "Summarize the failing build log below.\n"
         + "error: cannot find symbol in module parser, line 42\n" * 30},
    ]  # fmt: skip
    async with (
        AsyncOpenAI(base_url=f"{stack.url}/v1", api_key="none", max_retries=0) as client,
        aiohttp.ClientSession() as http,
    ):
        before = await prefill_pages(http, stack.url)
        raw = await client.chat.completions.with_raw_response.create(
            model=model,
            messages=messages,
            max_tokens=8,
        )
        assert raw.headers["x-smetric-reason"] == "first-turn-balance"
        home = raw.headers["x-smetric-prefill-worker"]
        reply = raw.parse()
        assert reply.usage is not None
        prompt_pages = reply.usage.prompt_tokens // stack.spec.workers.page_size
        assert prompt_pages >= 16

        async def indexed() -> bool:
            return (await prefill_pages(http, stack.url))[home] >= before[home] + prompt_pages

        await eventually(indexed, "the prefill's KV events for the prompt to reach the router")
        for turn in range(2):
            messages += [
                {"role": "assistant", "content": reply.choices[0].message.content or ""},
                {"role": "user", "content": f"Tool result {turn}: 3 tests still fail."},
            ]
            raw = await client.chat.completions.with_raw_response.create(
                model=model,
                messages=messages,
                max_tokens=8,
            )
            assert (raw.headers["x-smetric-prefill-worker"], raw.headers["x-smetric-reason"]) == (
                home,
                "sticky",
            )
            reply = raw.parse()
            assert reply.choices[0].message.content


async def prefill_pages(http: aiohttp.ClientSession, router: str) -> dict[str, int]:
    """The router's indexed GPU pages per prefill instance."""
    workers = (await listed_workers(http, router)).values()
    return {w["url"]: w["kv_pages"]["gpu"] for w in workers if w["role"] == "prefill"}
