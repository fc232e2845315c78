"""OpenAI Responses through the router over 2 real SGLang 0.5.23 workers.

The launch kind starts them with --enable-response-store (and the SGLang env has openai-harmony,
without which SGLang serves no /v1/responses). With the `openai` client: a chain of 3 responses
linked by previous_response_id lands on the worker holding it, SGLang's cached_tokens cover the
stored history, GET by id returns it from the holder (streamed and not); and for a request
without previous_response_id, the router's prompt ids (its conversion to SGLang's chat body) hash
to the very pages SGLang published in its KV events for it.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from smetric_router.features.chat_tokenizer import load_chat_tokenizer
from smetric_router.features.extract import FeatureExtractor
from smetric_router.launch import Stack
from smetric_router.launch.kinds.sglang import tokenizer_path
from tests.helpers.polling import eventually_sync
from tests.real_sglang.conftest import MODEL, flush
from tests.real_sglang.test_router_over_sglang import _views_agree

pytestmark = pytest.mark.sglang

PAGE = 16
INSTRUCTIONS = "You are a coding agent. You read files, run tools and edit code until done. "
TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "run",
        "description": "Run a shell command in the repository.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    }
]


def _create(client: openai.OpenAI, stream: bool, **kwargs: Any) -> tuple[Any, Any]:
    if not stream:
        raw = client.responses.with_raw_response.create(**kwargs)
        return raw.parse(), raw.headers
    raw = client.responses.with_raw_response.create(stream=True, **kwargs)
    events = list(raw.parse())
    assert events[0].type == "response.created", events[0]
    assert events[-1].type in ("response.completed", "response.incomplete"), events[-1]
    return events[-1].response, raw.headers


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_chain_lands_on_its_holder_and_get_by_id(sglang_stack: Stack, stream: bool) -> None:
    flush(sglang_stack)
    client = openai.OpenAI(base_url=sglang_stack.url + "/v1", api_key="none", max_retries=0)
    common = {"model": MODEL, "instructions": INSTRUCTIONS, "tools": TOOLS,
              "max_output_tokens": 8}  # fmt: skip
    first, headers = _create(client, stream, input="Task: make test_parse pass. " * 6, **common)
    holder = headers["x-smetric-worker"]
    assert headers["x-smetric-reason"] == "first-turn-balance"
    previous = first
    for turn in (1, 2):  # a chain of 3
        reply, headers = _create(
            client, stream, previous_response_id=previous.id, **common,
            input=[{"role": "user", "content": f"The tests still fail (try {turn})."}],
        )  # fmt: skip
        assert (headers["x-smetric-worker"], headers["x-smetric-reason"]) == (
            holder,
            "response-holder",
        ), turn
        assert reply.previous_response_id == previous.id
        # SGLang continued its stored conversation: the previous prompt's full pages were cached
        cached = reply.usage.input_tokens_details.cached_tokens
        assert cached >= previous.usage.input_tokens // PAGE * PAGE > 0, (turn, cached)
        previous = reply
    raw = client.responses.with_raw_response.retrieve(previous.id)
    assert (raw.headers["x-smetric-worker"], raw.headers["x-smetric-reason"]) == (
        holder,
        "response-holder",
    )
    got = raw.parse()
    assert got.id == previous.id and got.usage is not None
    assert got.usage.input_tokens == previous.usage.input_tokens
    with pytest.raises(openai.BadRequestError):  # the worker's own id is no router id
        client.responses.retrieve("resp_" + "0" * 32)


def test_router_pages_are_the_workers_for_a_stateless_request(sglang_stack: Stack) -> None:
    """store: false with the conversation as items: the router's ids for it are SGLang's."""
    flush(sglang_stack)
    client = openai.OpenAI(base_url=sglang_stack.url + "/v1", api_key="none", max_retries=0)
    features = FeatureExtractor(
        load_chat_tokenizer(tokenizer_path(sglang_stack.spec.sglang)), page_size=PAGE
    )
    body: dict[str, Any] = {
        "model": MODEL, "instructions": INSTRUCTIONS, "tools": TOOLS, "store": False,
        "input": [
            {"role": "developer", "content": "Keep changes small."},
            {"role": "user", "content": "Task: make test_parse pass. " * 4},
            {"type": "reasoning", "id": "rs_1", "summary": [
                {"type": "summary_text", "text": "Run the tests first."}]},
            {"type": "function_call", "call_id": "c1", "name": "run",
             "arguments": '{"cmd": "make test"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "1 failed"},
        ],
    }  # fmt: skip
    raw = client.responses.with_raw_response.create(max_output_tokens=8, **body)
    reply = raw.parse()
    chat = features.responses_chat(body)
    ids = features.prompt_token_ids(chat)
    assert features.from_chat(chat).prompt_len == len(ids) == reply.usage.input_tokens
    views = eventually_sync(
        _views_agree(sglang_stack, [ids]), "index == probe for the Responses ids"
    )
    worker = raw.headers["x-smetric-worker"]
    assert views[worker][0][0] == len(ids) // PAGE * PAGE, views
