"""The real coding agents, pinned (agents/package.json), run whole sessions through the embedded
default stack (emulated workers + the SMetric router, as `make run` starts it): a bug-fix task
in a scratch repository, non-interactively and under a time limit. Each run must end without an
API error after several requests, with follow-ups `sticky` on the worker holding their history
(its cached tokens in the replies), and the router's per-endpoint metrics must say the same.
A recording proxy in front of the router reads the decision headers the agents do not show."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from smetric_router.launch import ClusterSpec, RouterSpec, Stack
from tests.agents import clis
from tests.agents.recorder import Recorder, recording
from tests.agents.sessions import (
    assert_metrics_say_so,
    assert_served,
    assert_sticky_with_history,
)
from tests.helpers.prometheus import scrape, total


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    # the embedded default (launch/emulated.yaml), on a free port
    s = Stack(ClusterSpec(router=RouterSpec(port=0)))
    s.start()
    yield s
    s.stop()


@pytest.fixture
async def recorder(stack: Stack) -> AsyncIterator[Recorder]:
    async with recording(stack.url) as r:
        yield r


async def test_claude_code_fixes_a_bug_through_the_router(
    stack: Stack, recorder: Recorder, tmp_path: Path
) -> None:
    claude = clis.cli("claude")
    repo = clis.scratch_repo(tmp_path)
    model = stack.spec.workers.model_name
    env = clis.claude_env(tmp_path / "home", recorder.url, model)
    before = scrape(stack.url)
    done = await asyncio.to_thread(
        clis.run, [str(claude), "-p", clis.TASK, "--output-format", "json"], env, repo
    )
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    result = json.loads(done.stdout)
    assert result["is_error"] is False and result.get("api_error_status") is None, result
    assert result.get("api_error") is None, result
    assert result["num_turns"] >= 2, result
    posts = assert_served(recorder, "/v1/messages")
    assert_sticky_with_history(posts, stack.spec.workers.page_size)
    after = scrape(stack.url)
    assert_metrics_say_so(before, after, "/v1/messages")
    dropped = total(after, "smetric_anthropic_dropped_total", field="thinking")
    assert dropped - total(before, "smetric_anthropic_dropped_total", field="thinking") >= 2


async def test_codex_fixes_a_bug_through_the_router(
    stack: Stack, recorder: Recorder, tmp_path: Path
) -> None:
    codex = clis.cli("codex")
    repo = clis.scratch_repo(tmp_path)
    model = stack.spec.workers.model_name
    env = clis.codex_env(tmp_path / "home", recorder.url, model)
    before = scrape(stack.url)
    done = await asyncio.to_thread(clis.run, [str(codex), "exec", "--json", clis.TASK], env, repo)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    kinds = [e.get("type") for e in events]
    assert "turn.completed" in kinds and "error" not in kinds, kinds
    calls = [e for e in events if e.get("type") == "item.completed"
             and e.get("item", {}).get("type") == "command_execution"]  # fmt: skip
    assert calls, kinds
    posts = assert_served(recorder, "/v1/responses")
    assert len(posts) >= 2, posts
    assert_sticky_with_history(posts, stack.spec.workers.page_size)
    assert_metrics_say_so(before, scrape(stack.url), "/v1/responses")


async def test_opencode_fixes_a_bug_through_the_router(
    stack: Stack, recorder: Recorder, tmp_path: Path
) -> None:
    opencode = clis.cli("opencode")
    repo = clis.scratch_repo(tmp_path)
    model = stack.spec.workers.model_name
    (repo / "opencode.json").write_text(clis.opencode_config(recorder.url, model))
    env = clis.base_env(tmp_path / "home")
    before = scrape(stack.url)
    done = await asyncio.to_thread(clis.run, [str(opencode), "run", clis.TASK], env, repo)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    posts = assert_served(recorder, "/v1/chat/completions")
    assert_sticky_with_history(posts, stack.spec.workers.page_size)
    assert_metrics_say_so(before, scrape(stack.url), "/v1/chat/completions")
