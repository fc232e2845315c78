"""OpenAI Responses through the router, with the `openai` client against launched emulated workers:
chains linked by previous_response_id land on the worker holding their history (streamed and not),
GET and cancel by id reach it too, forged / foreign / malformed ids get a clean 400 and a removed
holder a 404 in OpenAI's shape, and a request without previous_response_id that carries its
conversation (store: false) is routed like chat.
"""

from __future__ import annotations

import json
import re
import urllib.request
from typing import Any

import aiohttp
import openai
import pytest

from smetric_router.router.api_responses import ResponseIds
from tests.e2e.conftest import StackFactory
from tests.e2e.raw import stream_cut_by_its_worker

INSTRUCTIONS = "You are a coding agent working in a Python repository. " * 8
TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file of the repository.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]
WORKER_ID = re.compile(r"resp_[0-9a-f]{32}")  # what SGLang (and the emulator) call a response


def _create(client: openai.OpenAI, stream: bool, **kwargs: Any) -> tuple[Any, dict[str, str]]:
    """(the response object, the reply's headers); a stream is read to its end."""
    if not stream:
        raw = client.responses.with_raw_response.create(**kwargs)
        return raw.parse(), dict(raw.headers)
    raw = client.responses.with_raw_response.create(stream=True, **kwargs)
    events = list(raw.parse())
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    assert "response.output_text.delta" in kinds, kinds
    assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
    ids = {e.response.id for e in events if hasattr(e, "response")}
    assert len(ids) == 1, ids  # every lifecycle event names the response alike
    return events[-1].response, dict(raw.headers)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_chains_land_on_their_holder_and_get_by_id(make_stack: StackFactory, stream: bool) -> None:
    # smetric-inflight places each chain's first response by load alone, so the chains land on
    # different workers and every continuation has to find its own holder (the default would
    # send all three to the holder of their shared instructions and tools, the cheapest prefill)
    stack = make_stack(policy="smetric-inflight", workers=4)
    model = stack.spec.workers.model_name
    page = stack.spec.workers.page_size
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="none", max_retries=0)
    holders = set()
    for chain in range(3):
        first, headers = _create(
            client, stream, model=model, instructions=INSTRUCTIONS, tools=TOOLS,
            input=f"Chain {chain}: the test test_parse fails; fix it.", max_output_tokens=12,
        )  # fmt: skip
        holder = headers["x-smetric-worker"]
        assert headers["x-smetric-reason"] == "first-turn-balance"
        holders.add(holder)
        previous, prompt = first, first.usage.input_tokens
        for turn in range(1, 5):  # a chain of 5 responses
            assert previous.id.startswith("resp_") and not WORKER_ID.fullmatch(previous.id)
            reply, headers = _create(
                client, stream, model=model, instructions=INSTRUCTIONS, tools=TOOLS,
                previous_response_id=previous.id, max_output_tokens=12,
                input=[{"type": "function_call_output", "call_id": f"c{turn}",
                        "output": f"def parse_{turn}(x):\n    return int(x)\n"}]
                if turn % 2 else f"Now step {turn}.",
            )  # fmt: skip
            assert (headers["x-smetric-worker"], headers["x-smetric-reason"]) == (
                holder,
                "response-holder",
            ), (chain, turn, headers)
            assert reply.previous_response_id == previous.id
            # the holder continued the stored conversation: its whole prompt was cached there
            cached = reply.usage.input_tokens_details.cached_tokens
            assert cached >= prompt // page * page, (turn, cached, prompt)
            assert reply.usage.input_tokens > prompt
            previous, prompt = reply, reply.usage.input_tokens
        raw = client.responses.with_raw_response.retrieve(previous.id)
        assert raw.headers["x-smetric-worker"] == holder
        assert raw.headers["x-smetric-reason"] == "response-holder"
        got = raw.parse()
        assert got.id == previous.id and got.output_text == previous.output_text
        done = client.responses.cancel(previous.id)  # finished already: returned as it is
        assert done.id == previous.id and done.status == previous.status
    assert len(holders) > 1, holders  # first responses are balanced, not all on one worker
    # per-endpoint metrics: 3 chains x 4 continuations, and the GET / cancel calls answered
    with urllib.request.urlopen(stack.url + "/metrics", timeout=10) as r:
        metrics = r.read().decode()
    line = 'smetric_endpoint_decisions_total{endpoint="/v1/responses",reason="response-holder"}'
    assert f"{line} 12.0" in metrics, [m for m in metrics.splitlines() if "response" in m]
    assert 'endpoint="/v1/responses/{id}",status="200"} 6.0' in metrics


def _error(exc: openai.APIStatusError) -> dict[str, Any]:
    body = exc.response.json()
    assert set(body) == {"error"}, body
    assert {"message", "type", "code"} <= set(body["error"]), body
    return dict(body["error"])


def test_forged_foreign_and_malformed_ids_get_a_clean_400(make_stack: StackFactory) -> None:
    stack = make_stack(workers=2)
    model = stack.spec.workers.model_name
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="none", max_retries=0)
    real = client.responses.create(model=model, input="hello", max_output_tokens=4)
    worker = stack.worker_urls[0]
    token = real.id.removeprefix("resp_")
    flipped = ("A" if token[10] != "A" else "B").join((token[:10], token[11:]))
    bad_ids = {
        "forged": "resp_" + flipped,
        "foreign": ResponseIds("another-deployments-key").encode(worker, "resp_" + "0" * 32),
        "workers_own": "resp_" + "0" * 32,
        "malformed": "resp_!!not-base64!!",
        "not_resp": "chatcmpl-123",
    }
    for what, bad in bad_ids.items():
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(
                model=model, input="again", previous_response_id=bad, max_output_tokens=4
            )
        err = _error(e.value)
        assert err["code"] == "invalid_response_id", (what, err)
        assert err["param"] == "previous_response_id", (what, err)
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.retrieve(bad)
        assert _error(e.value)["param"] == "response_id", what
        with pytest.raises(openai.BadRequestError):
            client.responses.cancel(bad)


async def test_a_removed_holder_is_a_404_that_says_so(make_stack: StackFactory) -> None:
    stack = make_stack(workers=2)
    model = stack.spec.workers.model_name
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="none", max_retries=0)
    raw = client.responses.with_raw_response.create(model=model, input="hi", max_output_tokens=4)
    first, holder = raw.parse(), raw.headers["x-smetric-worker"]
    async with aiohttp.ClientSession() as http:
        async with http.delete(f"{stack.url}/workers", params={"url": holder}) as r:
            assert r.status == 200, await r.text()
        try:
            with pytest.raises(openai.NotFoundError) as e:
                client.responses.create(
                    model=model, input="more", previous_response_id=first.id, max_output_tokens=4
                )
            err = _error(e.value)
            assert err["code"] == "response_holder_unavailable", err
            assert "not serving" in err["message"] and "removed" in err["message"], err
            with pytest.raises(openai.NotFoundError):
                client.responses.retrieve(first.id)
            # a new chain still works, on the worker that is left
            client.responses.create(model=model, input="hello", max_output_tokens=4)
        finally:
            async with http.post(f"{stack.url}/workers", json={"url": holder}) as r:
                assert r.status == 200, await r.text()


def test_stateless_conversation_is_routed_like_chat(make_stack: StackFactory) -> None:
    """store: false and the conversation sent back as input items (Codex's way): turn and history
    come from the items, so the follow-ups are sticky to the worker that holds their prefix."""
    stack = make_stack(workers=4)
    model = stack.spec.workers.model_name
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="none", max_retries=0)
    items: list[Any] = [{"role": "user", "content": "The test test_parse fails; fix it."}]
    home = None
    for turn in range(4):
        raw = client.responses.with_raw_response.create(
            model=model, instructions=INSTRUCTIONS, tools=TOOLS, input=items, store=False,
            max_output_tokens=12,
        )  # fmt: skip
        reply = raw.parse()
        worker, reason = raw.headers["x-smetric-worker"], raw.headers["x-smetric-reason"]
        if turn == 0:
            assert reason == "first-turn-balance"
            home = worker
        else:
            assert (worker, reason) == (home, "sticky"), (turn, worker, reason)
        with pytest.raises(openai.NotFoundError):  # not stored
            client.responses.retrieve(reply.id)
        items += [
            {"role": "assistant", "content": reply.output_text},
            {"type": "function_call", "call_id": f"c{turn}", "name": "read_file",
             "arguments": json.dumps({"path": f"src/m{turn}.py"})},
            {"type": "function_call_output", "call_id": f"c{turn}", "output": "x = 1"},
        ]  # fmt: skip


async def test_worker_lost_mid_stream_ends_with_an_error(make_stack: StackFactory) -> None:
    """The id-rewriting stream reader passes a worker lost mid-stream on to the usual cut
    handling: the events so far (ids rewritten), then the router's error event."""
    stack = make_stack(workers=1)
    worker = stack.worker_urls[0]
    body = {"model": "m", "input": "Explain list comprehensions.", "max_output_tokens": 40,
            "stream": True}  # fmt: skip
    frames = await stream_cut_by_its_worker(stack.url, worker, "/v1/responses", body)
    assert frames[0].startswith("event: response.created"), frames
    first = json.loads(frames[0].split("data: ", 1)[1])
    assert not WORKER_ID.fullmatch(first["response"]["id"]), first  # rewritten all the same
    data = json.loads(frames[-2].removeprefix("data: "))
    assert "lost mid-stream" in data["error"]["message"], frames
    assert frames[-1] == "data: [DONE]", frames
