"""Answers end at a natural length drawn from the trace's output lengths, unless max_tokens cuts
them or ignore_eos forces max_tokens."""

from __future__ import annotations

import json
import random

import pytest

from smetric_router.emulator.output_lengths import TABLE, natural_length, quantiles
from tests.emulator.conftest import Worker

IM_END = 2  # the bundled tokenizer's <|im_end|>


def test_the_table_says_where_it_comes_from_and_is_sampled_as_it_says() -> None:
    data = json.loads(TABLE.read_text())
    assert "mooncake-conversation.jsonl" in data["source"] and data["made_by"]
    q = quantiles()
    assert (q[10], q[25], q[50], q[75], q[90], q[100]) == (24, 156, 350, 472, 597, 2000)
    rng = random.Random(7)
    seeds = [rng.getrandbits(64) for _ in range(20_000)]
    draws = sorted(natural_length(s) for s in seeds)
    assert [natural_length(s) for s in seeds[:50]] == [natural_length(s) for s in seeds[:50]]
    assert draws[0] >= 1 and draws[-1] <= 2000
    for p, want in ((0.25, 156), (0.5, 350), (0.9, 597)):
        assert abs(draws[int(p * len(draws))] - want) <= 0.05 * want
    assert abs(sum(draws) / len(draws) - 343) < 15


def _chat(i: int, **extra: object) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": f"question number {i}"}], **extra}


async def test_a_chat_answer_ends_its_turn_at_its_own_length(worker: Worker) -> None:
    lengths = set()
    for i in range(6):
        status, full = await worker.post("/v1/chat/completions", _chat(i, max_tokens=5000))
        assert status == 200
        n = full["usage"]["completion_tokens"]
        lengths.add(n)
        choice = full["choices"][0]
        assert 1 <= n <= 2000 and choice["finish_reason"] == "stop"
        assert choice["matched_stop"] == IM_END
        _, again = await worker.post("/v1/chat/completions", _chat(i, max_tokens=5000))
        assert again["choices"][0]["message"] == choice["message"]  # same request, same answer
        _, open_ended = await worker.post("/v1/chat/completions", _chat(i))
        assert open_ended["usage"]["completion_tokens"] == n  # no max: the context bounds it
        if n > 1:  # a smaller budget cuts the same text: finish length, no end of turn
            _, cut = await worker.post("/v1/chat/completions", _chat(i, max_tokens=n - 1))
            assert cut["usage"]["completion_tokens"] == n - 1
            assert cut["choices"][0]["finish_reason"] == "length"
            assert choice["message"]["content"].startswith(cut["choices"][0]["message"]["content"])
    assert len(lengths) > 1


@pytest.mark.parametrize("stream", [False, True])
async def test_ignore_eos_forces_max_tokens(worker: Worker, stream: bool) -> None:
    body = _chat(1, max_tokens=3000, ignore_eos=True, stream=stream,
                 stream_options={"include_usage": True})  # fmt: skip
    if stream:
        events = await worker.sse("/v1/chat/completions", body)
        usage = events[-2]["usage"]
        assert events[-3]["choices"][0]["finish_reason"] == "stop"
    else:
        _, reply = await worker.post("/v1/chat/completions", body)
        usage = reply["usage"]
    assert usage["completion_tokens"] == 3000  # more than any natural answer
    status, reply = await worker.post("/v1/chat/completions", {**body, "ignore_eos": "maybe"})
    assert status == 400 and "ignore_eos" in reply["message"]


async def test_generate_and_completions_are_natural_unless_ignore_eos(worker: Worker) -> None:
    ids = None
    for i in range(4):
        gen = {"text": f"count {i}", "sampling_params": {"max_new_tokens": 4000}}
        _, out = await worker.post("/generate", gen)
        meta = out["meta_info"]
        assert meta["finish_reason"] == {"type": "stop", "matched": IM_END}
        assert out["output_ids"][-1] == IM_END and meta["completion_tokens"] <= 2000
        ids = out["output_ids"]
        forced = {**gen, "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}}
        _, out = await worker.post("/generate", forced)
        assert out["meta_info"]["completion_tokens"] == 4000
        assert out["meta_info"]["finish_reason"]["type"] == "length"
        _, out = await worker.post("/v1/completions", {"prompt": f"count {i}", "max_tokens": 4000})
        assert out["choices"][0]["finish_reason"] == "stop"
        assert out["usage"]["completion_tokens"] <= 2000
        forced_c = {"prompt": f"count {i}", "max_tokens": 4000, "ignore_eos": True}
        _, out = await worker.post("/v1/completions", forced_c)
        assert out["usage"]["completion_tokens"] == 4000
        assert out["choices"][0]["finish_reason"] == "length"
    assert ids is not None
    _, out = await worker.post(
        "/generate", {"text": "count", "sampling_params": {"max_new_tokens": 0}}
    )
    assert out["meta_info"]["completion_tokens"] == 0  # prefill only, as before


async def test_messages_and_responses_end_naturally_or_are_cut(worker: Worker) -> None:
    msg = {"model": "m", "max_tokens": 32000, "messages": [{"role": "user", "content": "hi"}]}
    _, reply = await worker.post("/v1/messages", msg)
    assert reply["stop_reason"] == "end_turn" and reply["usage"]["output_tokens"] <= 2000
    _, cut = await worker.post("/v1/messages", {**msg, "max_tokens": 1})
    n = reply["usage"]["output_tokens"]
    assert cut["stop_reason"] == ("max_tokens" if n > 1 else "end_turn")
    _, resp = await worker.post("/v1/responses", {"model": "m", "input": "hi"})
    assert resp["status"] == "completed" and resp["usage"]["output_tokens"] <= 2000
    _, cut = await worker.post(
        "/v1/responses", {"model": "m", "input": "hi", "max_output_tokens": 3}
    )
    assert cut["status"] == "incomplete" and cut["usage"]["output_tokens"] == 1
