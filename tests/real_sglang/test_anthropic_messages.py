"""Anthropic Messages through the router over 2 real SGLang 0.5.23 workers.

With the `anthropic` client: a multi-turn tool-use session (assistant tool_use, user
tool_result) sticks to its worker and SGLang's own usage.cache_read_input_tokens covers the
history, streamed and not; the router's prompt ids for the Messages request (its conversion to
SGLang's chat body, rendered and tokenized by the router) hash to the very pages SGLang published
in its KV events for that request, and the router's count_tokens equals the worker's own.
"""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from smetric_router.features.chat_tokenizer import load_chat_tokenizer
from smetric_router.features.extract import FeatureExtractor
from smetric_router.launch import Stack
from smetric_router.launch.kinds.sglang import tokenizer_path
from tests.helpers.polling import eventually_sync
from tests.real_sglang.conftest import MODEL, flush, post_json
from tests.real_sglang.test_router_over_sglang import _views_agree

pytestmark = pytest.mark.sglang

PAGE = 16
SYSTEM = "You are a coding agent. You read files, run tools and edit code until the task is done. "
TOOLS: list[Any] = [
    {
        "name": "run",
        "description": "Run a shell command in the repository.",
        "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    }
]
TURNS = 4


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_tool_use_session_sticks_with_sglang_cache_hits(sglang_stack: Stack, stream: bool) -> None:
    flush(sglang_stack)
    client = anthropic.Anthropic(base_url=sglang_stack.url, api_key="none", max_retries=0)
    features = FeatureExtractor(
        load_chat_tokenizer(tokenizer_path(sglang_stack.spec.sglang)), page_size=PAGE
    )
    messages: list[Any] = [{"role": "user", "content": "Task: make test_parse pass. " * 6}]
    workers, reasons, hits = [], [], []
    previous = 0
    body: dict[str, Any] = {}
    for turn in range(TURNS):
        body = {"model": MODEL, "max_tokens": 8, "system": SYSTEM, "tools": TOOLS,
                "messages": list(messages)}  # fmt: skip
        if stream:
            raw = client.messages.with_raw_response.create(stream=True, **body)
            events = list(raw.parse())
            assert events[0].type == "message_start" and events[-1].type == "message_stop"
            usage = events[0].message.usage
        else:
            raw = client.messages.with_raw_response.create(**body)
            usage = raw.parse().usage
        workers.append(raw.headers["x-smetric-worker"])
        reasons.append(raw.headers["x-smetric-reason"])
        cached = usage.cache_read_input_tokens or 0
        hits.append((cached, previous))
        previous = usage.input_tokens + cached
        # the router counts the prompt SGLang served
        assert features.from_chat(features.messages_chat(body)).prompt_len == previous
        call = f"toolu_{turn}"
        messages += [
            {"role": "assistant", "content": [
                {"type": "text", "text": "Running the tests."},
                {"type": "tool_use", "id": call, "name": "run", "input": {"cmd": "make test"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": call,
                 "content": f"\n  test_parse failed (try {turn})"}]},
        ]  # fmt: skip
    assert reasons == ["first-turn-balance"] + ["sticky"] * (TURNS - 1), reasons
    assert len(set(workers)) == 1, workers
    # each follow-up was served from the cache of everything before it (its full pages)
    assert all(cached >= prev // PAGE * PAGE > 0 for cached, prev in hits[1:]), hits

    # The router's ids for the last request are the worker's: SGLang's KV events for them (the
    # router's index) and the worker's own radix tree (patched probe) both say the worker holds
    # every full page of exactly those ids.
    ids = features.prompt_token_ids(features.messages_chat(body))
    assert len(ids) == previous
    views = eventually_sync(
        _views_agree(sglang_stack, [ids]), "index == probe for the Messages ids"
    )
    assert views[workers[0]][0][0] == len(ids) // PAGE * PAGE, views

    # count_tokens: the router's local answer equals the worker's own
    ask = {k: body[k] for k in ("model", "system", "tools", "messages")}
    mine = client.messages.count_tokens(**ask).input_tokens
    theirs = post_json(workers[0] + "/v1/messages/count_tokens", ask)["input_tokens"]
    assert mine == theirs == previous
