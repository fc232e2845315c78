"""The router's token limits against real SGLang 0.5.23 workers: the context length is read
from SGLang's own /v1/models (max_model_len), and what the router refuses itself, SGLang refuses
with the same message (the prompt counted the same, token for token)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from smetric_router.launch import Stack
from tests.real_sglang.conftest import MODEL, get_json

pytestmark = pytest.mark.sglang


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with http.post(url, json=body) as r:
        return r.status, await r.json(content_type=None)


def _message(body: Any) -> str:
    """error.message (OpenAI's and /generate's shape) or SGLang's top-level message."""
    return str(body["error"]["message"] if "error" in body else body["message"])


async def test_limits_are_sglangs(sglang_stack: Stack) -> None:
    context = get_json(sglang_stack.worker_urls[0] + "/v1/models")["data"][0]["max_model_len"]
    listed = get_json(sglang_stack.url + "/workers")["workers"]
    assert [w["context_length"] for w in listed] == [context] * len(listed)
    messages = [{"role": "user", "content": "Summarize the repository layout."}]
    cases = [
        ("/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": context}),
        ("/v1/completions", {"model": MODEL, "prompt": "def main():", "max_tokens": context}),
        ("/generate", {"text": "def main():", "sampling_params": {"max_new_tokens": context}}),
        ("/generate", {"input_ids": [11] * context}),
    ]
    async with aiohttp.ClientSession() as http:
        for path, body in cases:
            status, mine = await _post(http, sglang_stack.url + path, body)
            assert status == 400 and mine["error"]["code"] == "context_length_exceeded", mine
            status, theirs = await _post(http, sglang_stack.worker_urls[0] + path, body)
            assert status == 400, theirs
            assert _message(mine) == _message(theirs), path
        # one token less fits, and is served
        fits = {"text": "def main():", "sampling_params": {"max_new_tokens": 2}}
        status, body = await _post(http, sglang_stack.url + "/generate", fits)
        assert status == 200, body
