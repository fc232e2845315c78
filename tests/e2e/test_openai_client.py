"""The openai client against the launched stack: chat and completions, streaming and not."""

from __future__ import annotations

import aiohttp
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.conftest import StackFactory
from tests.helpers.polling import eventually


async def test_openai_client_chat_and_completions(make_stack: StackFactory) -> None:
    stack = make_stack(workers=2)
    model = stack.spec.workers.model_name
    async with AsyncOpenAI(base_url=f"{stack.url}/v1", api_key="none", max_retries=0) as client:
        assert [m.id for m in (await client.models.list()).data] == [model]

        messages: list[ChatCompletionMessageParam] = [
            {"role": "user", "content": "Reverse a linked list in Python."}
        ]
        raw = await client.chat.completions.with_raw_response.create(
            model=model,
            messages=messages,
            max_tokens=12,
            extra_body={"ignore_eos": True},  # exactly 12 tokens
        )
        assert raw.headers["x-smetric-worker"] in stack.worker_urls
        assert raw.headers["x-smetric-reason"] == "first-turn-balance"
        reply = raw.parse()
        assert reply.choices[0].message.content
        assert reply.usage is not None and reply.usage.completion_tokens == 12

        stream = await client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=12,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        chunks = [c async for c in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert len(chunks) > 3 and text

        done = await client.completions.create(
            model=model, prompt="def reverse(xs):", max_tokens=8, extra_body={"ignore_eos": True}
        )
        assert done.choices[0].text

        # one model: like SGLang, it answers to any name (tests/e2e/test_model_names.py)
        done = await client.completions.create(
            model="default", prompt="x", max_tokens=2, extra_body={"ignore_eos": True}
        )
        assert done.choices[0].text


async def test_generate_with_turn_hint_and_bad_input(make_stack: StackFactory) -> None:
    stack = make_stack(workers=2)
    async with aiohttp.ClientSession() as http:
        body = {"text": "hello " * 40, "sampling_params": {"max_new_tokens": 4}}
        async with http.post(f"{stack.url}/generate", json=body) as r:
            assert r.status == 200
            assert r.headers["x-smetric-reason"] == "first-turn-balance"
            home = r.headers["x-smetric-worker"]
            first = await r.json()
        # KV events reach the router asynchronously: wait until it has indexed the first prompt.
        prompt_pages = (first["meta_info"]["prompt_tokens"] - 1) // stack.spec.workers.page_size
        assert prompt_pages >= 4

        async def indexed() -> bool:
            async with http.get(f"{stack.url}/workers") as r:
                pages = {w["url"]: w["kv_pages"]["gpu"] for w in (await r.json())["workers"]}
            return bool(pages[home] >= prompt_pages)

        await eventually(indexed, f"{prompt_pages} pages of the first prompt indexed on {home}")
        # A hinted follow-up carrying the first prompt as its history sticks to its cache holder.
        body = {"text": "hello " * 40 + first["text"] + " more", "smetric": {"turn": 1},
                "sampling_params": {"max_new_tokens": 4}}  # fmt: skip
        async with http.post(f"{stack.url}/generate", json=body) as r:
            assert r.status == 200
            assert (r.headers["x-smetric-worker"], r.headers["x-smetric-reason"]) == (
                home,
                "sticky",
            )

        json_type = {"Content-Type": "application/json"}
        async with http.post(
            f"{stack.url}/v1/chat/completions", data=b"{not json", headers=json_type
        ) as r:
            assert r.status == 400
            assert (await r.json())["error"]["type"] == "invalid_request_error"
        for name in ("x", stack.spec.workers.model_name):  # one model answers to any name
            async with http.post(f"{stack.url}/v1/chat/completions", json={"model": name}) as r:
                assert r.status == 400  # no messages
                assert "messages" in (await r.json())["error"]["message"]
        async with http.get(f"{stack.url}/health") as r:
            assert r.status == 200  # still serving
