"""Traces -> bench_serving's agentic-trace JSON: the schema SGLang 0.5.23's AgenticTraceDataset
reads, shared blocks as shared text, follow-ups as appended user messages, chains split where a
request does not extend the previous one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from smetric_router.traces.generate import GenConfig, generate
from smetric_router.traces.schema import TraceRequest
from smetric_router.traces.to_agentic import DEFAULT_TOKENIZER, Options, convert, main

TOK = Tokenizer.from_file(str(DEFAULT_TOKENIZER / "tokenizer.json"))


def _req(rid: str, session: str, turn: int, ids: list[int], input_len: int, out: int = 8,
         trigger: str | None = None) -> TraceRequest:  # fmt: skip
    return TraceRequest(rid, float(turn), session, None, turn, input_len, out, tuple(ids), 16,
                        trigger)  # fmt: skip


def _tokens(text: str) -> int:
    return len(TOK.encode(text, add_special_tokens=False).ids)


def test_shape_shared_system_prompt_and_follow_ups() -> None:
    reqs = [
        # two sessions opening with the same 3-block system prompt
        _req("a0", "a", 0, [1, 2, 3, 10, 11], 80),
        _req("b0", "b", 0, [1, 2, 3, 20], 64),
        # a's follow-up re-sends a0 (5 blocks) and its 8-token reply, then adds new blocks
        _req("a1", "a", 1, [1, 2, 3, 10, 11, 12, 13], 112),
    ]
    doc = convert(reqs, Options(tokens_per_block=4))
    a, b = doc["conversations"]
    assert [t["prompt_tokens"] for t in a] == [20, 28]  # 80 and 112 trace tokens at 4/16
    sys_a, user_a = a[0]["messages"]
    assert sys_a["role"] == "system" and user_a["role"] == "user"
    assert sys_a == b[0]["messages"][0]  # the shared blocks are the same text
    assert _tokens(sys_a["content"]) == 12 and _tokens(user_a["content"]) == 8
    assert user_a["content"] != b[0]["messages"][1]["content"]
    # the follow-up: one user message with what a1 adds after a0's prompt + reply (88 tokens: from
    # block 5 on), not the history
    [follow] = a[1]["messages"]
    assert follow["role"] == "user" and _tokens(follow["content"]) == 8
    assert doc["metadata"]["conversations"] == 2 and doc["metadata"]["turns"] == 3


def test_compaction_and_shrinking_prompts_start_new_conversations() -> None:
    reqs = [
        _req("s0", "s", 0, [1, 2, 3], 48),
        _req("s1", "s", 1, [1, 2, 3, 4], 64),
        _req("s2", "s", 2, [1, 9], 32, trigger="compaction"),
        _req("s3", "s", 3, [1, 9, 10], 48),
    ]
    doc = convert(reqs, Options())
    assert [len(c) for c in doc["conversations"]] == [2, 2]


def test_limits() -> None:
    reqs = [_req(f"s{i}-{t}", f"s{i}", t, list(range(100 * i, 100 * i + 2 + t)), 32 + 16 * t)
            for i in range(4) for t in range(4)]  # fmt: skip
    doc = convert(reqs, Options(conversations=3, max_turns=2))
    assert [len(c) for c in doc["conversations"]] == [2, 2, 2]
    doc = convert(reqs, Options(max_prompt_tokens=48))
    assert [len(c) for c in doc["conversations"]] == [2, 2, 2, 2]
    with pytest.raises(ValueError, match="no conversation"):
        convert(reqs, Options(min_turns=5))


def test_cli_on_a_generated_trace(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    generate(GenConfig(sessions=12, seed=3), trace)
    out = tmp_path / "conv.json"
    main([str(trace), "--out", str(out), "--tokens-per-block", "2", "--max-turns", "4",
          "--conversations", "24"])  # fmt: skip
    doc = json.loads(out.read_text())
    assert doc["metadata"]["source"] == str(trace) and doc["metadata"]["format"] == "bailian"
    assert len(doc["conversations"]) == 24
    # what sglang.benchmark.datasets.agentic_trace reads: a list of turns of role/content messages
    for conv in doc["conversations"]:
        assert 1 <= len(conv) <= 4
        for turn in conv:
            assert turn["prompt_tokens"] > 0 and turn["messages"]
            assert all(set(m) == {"role", "content"} and m["content"] for m in turn["messages"])
            assert {m["role"] for m in turn["messages"]} <= {"system", "user"}


def test_agent_mode_tools_ride_along_and_follow_ups_read_as_tool_output() -> None:
    reqs = [_req("a0", "a", 0, [1, 2, 3], 48), _req("a1", "a", 1, [1, 2, 3, 4, 5], 80)]
    plain = convert(reqs, Options(tokens_per_block=4))
    agent = convert(reqs, Options(tokens_per_block=4, agent=True))
    assert "tools" not in plain["metadata"]
    names = [t["function"]["name"] for t in agent["metadata"]["tools"]]
    assert names == ["read_file", "run", "edit_file"]
    # the first turn is unchanged; the follow-up is the plain one's text as a tool prints it (a
    # user message: bench_serving drops tool_call_id, which OpenAI's schema requires on tools)
    assert agent["conversations"][0][0] == plain["conversations"][0][0]
    [tool] = agent["conversations"][0][1]["messages"]
    [user] = plain["conversations"][0][1]["messages"]
    assert tool == {"role": "user", "content": "\n  " + user["content"]}
