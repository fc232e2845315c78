"""Clients commonly send model "default": a one-model cluster serves any name, as SGLang does."""

from __future__ import annotations

import aiohttp
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.conftest import StackFactory


async def test_any_model_name_is_served_by_a_one_model_cluster(make_stack: StackFactory) -> None:
    stack = make_stack(workers=2)
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "Fix the failing test."}
    ]
    async with AsyncOpenAI(base_url=f"{stack.url}/v1", api_key="none", max_retries=0) as client:
        for name in ("default", "gpt-4o-mini"):
            reply = await client.chat.completions.create(
                model=name,
                messages=messages,
                max_tokens=4,
            )
            assert reply.model == name and reply.choices[0].message.content  # SGLang echoes it
            done = await client.completions.create(model=name, prompt="def f():", max_tokens=4)
            assert done.choices[0].text
    async with aiohttp.ClientSession() as http:
        body = {"model": "default", "text": "hello", "sampling_params": {"max_new_tokens": 2}}
        async with http.post(f"{stack.url}/generate", json=body) as r:
            assert r.status == 200
        # the emulated worker itself, as SGLang
        chat = {"model": "default", "messages": messages, "max_tokens": 2}
        async with http.post(f"{stack.worker_urls[0]}/v1/chat/completions", json=chat) as r:
            assert r.status == 200 and (await r.json())["model"] == "default"
