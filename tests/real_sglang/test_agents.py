"""Claude Code and Codex, pinned, one turn each through the router in front of two real SGLang
0.5.23 workers on CPU.

The workers serve a terse copy of the tiny random model: its generation config names every even
token id an end of turn, so an answer is a handful of gibberish tokens, as a real model's turn
ends, instead of running until the context is full (a random model almost never samples its one
`<|im_end|>`, and Codex sends no output limit, which SGLang's Responses turns into "up to the
context length", past `--preferred-sampling-params`). What is proven is that real workers take
the agents' real requests through the router: every request answered 200 with a decision,
Claude Code's `thinking` dropped for workers without a reasoning parser, and any continuation
sticky on its cache."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from smetric_router.launch import ClusterSpec, RouterSpec, SglangSpec, Stack, WorkerSpec
from smetric_router.launch.tiny_model import ensure_tiny_model
from tests.agents import clis
from tests.agents.recorder import Recorder, recording
from tests.agents.sessions import assert_served
from tests.helpers.prometheus import scrape, total
from tests.real_sglang.conftest import MODEL, ROUTER_ARGS, require_sglang_env

pytestmark = pytest.mark.sglang

ANSWER_TOKENS = 24  # the cap, should a run of odd ids go on


def terse_tiny_model(out: Path) -> Path:
    """The tiny model with every even token id an end of turn (its generation config's eos list,
    which SGLang adds to the model's own)."""
    ensure_tiny_model(out)
    path = out / "generation_config.json"
    generation = json.loads(path.read_text())
    vocab = json.loads((out / "config.json").read_text())["vocab_size"]
    generation["eos_token_id"] = sorted({generation["eos_token_id"], *range(0, vocab, 2)})
    path.write_text(json.dumps(generation))
    return out


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    require_sglang_env()
    clis.cli("claude")
    clis.cli("codex")
    model = terse_tiny_model(tmp_path_factory.mktemp("terse-tiny"))
    cap = ("--preferred-sampling-params", json.dumps({"max_new_tokens": ANSWER_TOKENS}))
    spec = ClusterSpec(
        router=RouterSpec(port=0, extra_args=ROUTER_ARGS),
        workers=WorkerSpec(kind="sglang", count=2, page_size=16, extra_args=cap),
        sglang=SglangSpec(model_path=str(model), served_model_name=MODEL, max_total_tokens=65536),
    )
    with Stack(spec) as s:
        yield s


@pytest.fixture
async def recorder(stack: Stack) -> AsyncIterator[Recorder]:
    async with recording(stack.url) as r:
        yield r


async def test_claude_code_one_turn_on_real_sglang(
    stack: Stack, recorder: Recorder, tmp_path: Path
) -> None:
    claude = clis.cli("claude")
    repo = clis.scratch_repo(tmp_path)
    env = clis.claude_env(tmp_path / "home", recorder.url, MODEL)
    env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(ANSWER_TOKENS)
    argv = [str(claude), "-p", clis.TASK, "--output-format", "json", "--max-turns", "1"]
    done = await asyncio.to_thread(clis.run, argv, env, repo)
    result = json.loads(done.stdout)
    assert result.get("api_error_status") is None, result
    # an answer that ran into the cap is reported as max_output_tokens after Claude Code asked
    # it to go on; nothing else
    assert result.get("api_error") in (None, "max_output_tokens"), result
    posts = assert_served(recorder, "/v1/messages")
    # (no usage check: SGLang's Messages stream reports input_tokens 0 when the answer is empty,
    # its end of turn sampled first, which half of the terse model's answers are)
    assert posts[0].reason == "first-turn-balance", posts
    # a continuation (after an answer that ran into the cap) carries the answer so far: sticky;
    # a retry after an empty answer, or a side query, starts over: balanced
    assert {e.reason for e in posts} <= {"first-turn-balance", "sticky"}, posts
    dropped = total(scrape(stack.url), "smetric_anthropic_dropped_total", field="thinking")
    assert dropped >= len(posts) >= 1


async def test_codex_one_turn_on_real_sglang(
    stack: Stack, recorder: Recorder, tmp_path: Path
) -> None:
    codex = clis.cli("codex")
    repo = clis.scratch_repo(tmp_path)
    env = clis.codex_env(tmp_path / "home", recorder.url, MODEL)
    done = await asyncio.to_thread(clis.run, [str(codex), "exec", "--json", clis.TASK], env, repo)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    kinds = [e.get("type") for e in events]
    assert "turn.completed" in kinds and "error" not in kinds, kinds
    posts = assert_served(recorder, "/v1/responses")
    assert posts[0].reason == "first-turn-balance", posts
