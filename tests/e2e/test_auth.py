"""Keys end to end: a launched router with --api-key/--admin-api-key in front of emulated workers
started with SGLang's --api-key, the worker key given to the router in its environment."""

from __future__ import annotations

from collections.abc import Iterator

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from smetric_router.launch import ClusterSpec, RouterSpec, Stack, WorkerSpec
from tests.e2e.conftest import ROUTER_ARGS, SPEEDUP
from tests.e2e.raw import PAGE, token_ids
from tests.helpers.polling import eventually

KEY, ADMIN, WORKER_KEY = "client-key-1", "admin-key-2", "worker-key-3"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SMETRIC_WORKER_API_KEY", WORKER_KEY)  # the router reads it at start
        spec = ClusterSpec(
            router=RouterSpec(
                port=0, extra_args=(*ROUTER_ARGS, "--api-key", KEY, "--admin-api-key", ADMIN)
            ),
            workers=WorkerSpec(count=2, speedup=SPEEDUP, extra_args=("--api-key", WORKER_KEY)),
        )
        with Stack(spec) as s:
            yield s


async def test_openai_client_with_the_api_key(stack: Stack) -> None:
    model = stack.spec.workers.model_name
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Reverse a list."}]
    async with AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=KEY, max_retries=0) as client:
        assert [m.id for m in (await client.models.list()).data] == [model]
        raw = await client.chat.completions.with_raw_response.create(
            model=model,
            messages=messages,
            max_tokens=4,
        )
        assert raw.headers["x-smetric-worker"] in stack.worker_urls
        assert raw.parse().choices[0].message.content
        stream = await client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=4,
            stream=True,
        )
        assert [c async for c in stream]
    async with AsyncOpenAI(base_url=f"{stack.url}/v1", api_key="wrong", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError) as e:
            await client.models.list()
        assert e.value.status_code == 401 and e.value.code == "invalid_api_key"


async def test_workers_get_the_worker_key_for_everything(stack: Stack) -> None:
    async with aiohttp.ClientSession() as http:
        # the workers really want it
        async with http.get(stack.worker_urls[0] + "/server_info") as r:
            assert r.status == 401
        # /server_info was read with it: the KV events were found, so hits reach the index and
        # a follow-up sticks to its cache holder
        ids = token_ids(7, 6 * PAGE)
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 4}}
        async with http.post(f"{stack.url}/generate", json=body, headers=bearer(KEY)) as r:
            assert r.status == 200, await r.text()
            home = r.headers["x-smetric-worker"]

        async def indexed() -> bool:
            async with http.get(f"{stack.url}/workers", headers=bearer(KEY)) as r:
                pages: dict[str, int] = {
                    w["url"]: w["kv_pages"]["gpu"] for w in (await r.json())["workers"]
                }
            return pages[home] >= 5

        await eventually(indexed, "the first prompt in the router's index")
        follow = {**body, "input_ids": ids + token_ids(8, PAGE), "smetric": {"turn": 1}}
        async with http.post(f"{stack.url}/generate", json=follow, headers=bearer(KEY)) as r:
            assert r.status == 200
            assert r.headers["x-smetric-reason"] == "sticky"
            assert r.headers["x-smetric-worker"] == home
        # admin: the admin key only, and the flush reaches every worker with the worker key
        async with http.post(f"{stack.url}/flush_cache", headers=bearer(KEY)) as r:
            assert r.status == 403
        async with http.post(f"{stack.url}/flush_cache", headers=bearer(ADMIN)) as r:
            assert r.status == 200, await r.text()
            results = (await r.json())["results"]
        assert {u: res["status"] for u, res in results.items()} == {
            u: 200 for u in stack.worker_urls
        }
        async with http.get(f"{stack.url}/metrics") as r:  # open, and no key in it
            text = await r.text()
            assert r.status == 200 and WORKER_KEY not in text and KEY not in text
