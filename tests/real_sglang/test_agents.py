"""Claude Code, pinned, one turn through the router in front of two real SGLang
0.5.23 workers on CPU (the tiny random model: its text is gibberish, so the agents get no tool
call to run; what is proven is that the real workers take the agents' real requests through the
router: every request answered 200 with a decision, Claude Code's `thinking` dropped for workers
that have no reasoning parser, and its continuations sticky on their cache).

The tiny random model almost never emits its end of turn: Claude Code's max_tokens is capped with
CLAUDE_CODE_MAX_OUTPUT_TOKENS. Codex is not run here: it sends no output limit, and SGLang's
`--preferred-sampling-params` does not cap a Responses request (its max_new_tokens None
overrides it), so a run lasts until the random model happens on its end of turn."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from smetric_router.launch import ClusterSpec, RouterSpec, SglangSpec, Stack, WorkerSpec
from tests.agents import clis
from tests.agents.recorder import Recorder, recording
from tests.agents.sessions import assert_served
from tests.prom import sample_sum, scrape
from tests.real_sglang.conftest import MODEL, ROUTER_ARGS, require_sglang_env

pytestmark = pytest.mark.sglang

ANSWER_TOKENS = 24
ANSWER_CAP = ("--preferred-sampling-params", json.dumps({"max_new_tokens": ANSWER_TOKENS}))


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    require_sglang_env()
    clis.cli("claude")
    spec = ClusterSpec(
        router=RouterSpec(port=0, extra_args=ROUTER_ARGS),
        workers=WorkerSpec(kind="sglang", count=2, page_size=16, extra_args=ANSWER_CAP),
        sglang=SglangSpec(max_total_tokens=65536),
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
    # every answer of the tiny random model runs into its max_tokens (it never ends its turn),
    # which Claude Code reports as max_output_tokens after asking it to go on; nothing else
    assert result.get("api_error_status") is None, result
    assert result.get("api_error") in (None, "max_output_tokens"), result
    posts = assert_served(recorder, "/v1/messages")
    assert posts[0].reason == "first-turn-balance" and posts[0].prompt_tokens, posts
    # Claude Code's continuations carry the answer so far: they stick to its cache
    for e in posts[1:]:
        assert e.reason == "sticky" and (e.cached_tokens or 0) >= posts[0].prompt_tokens // 16 * 16
    dropped = sample_sum(scrape(stack.url), "smetric_anthropic_dropped_total", field="thinking")
    assert dropped >= len(posts) >= 1
