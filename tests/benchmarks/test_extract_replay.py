"""benchmarks.extract_replay at a tiny size: every request of compare's workload is extracted
once, first turns apart, and the tokenizer's share is part of the time measured."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.extract_replay import main
from smetric_router.features.prompt_tokenizer import PromptTokenizer


def test_every_request_of_the_workload_is_extracted_once(tmp_path: Path) -> None:
    encode = PromptTokenizer._encode
    out = tmp_path / "replay.md"
    cost = main(["--conversations", "4", "--sessions", "20", "--work-dir", str(tmp_path / "w"),
                 "--out", str(out)])  # fmt: skip
    doc = json.loads((tmp_path / "w" / "conversations.json").read_text())
    turns = [len(c) for c in doc["conversations"]]
    assert cost.first_turns == 4 and cost.requests == sum(turns)
    assert cost.follow_ups == sum(turns) - 4 > 0
    assert 0 < cost.tokenizer_s < cost.first_s + cost.follow_s
    assert cost.prompt_tokens > 0
    assert PromptTokenizer._encode is encode  # the timing wrapper is gone afterwards
    assert f"| {sum(turns)} | " in out.read_text()


def test_replicas_extract_the_same_prompts(tmp_path: Path) -> None:
    """Dealt to several extractors, follow-ups start cold but come out the same."""
    args = ["--conversations", "4", "--sessions", "20", "--work-dir", str(tmp_path / "w")]
    one = main(args)
    three = main([*args, "--replicas", "3"])
    assert (three.requests, three.first_turns) == (one.requests, one.first_turns)
    assert three.prompt_tokens == one.prompt_tokens
