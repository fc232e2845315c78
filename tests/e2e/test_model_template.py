"""Agent-shaped sessions (tools, assistant tool calls, tool results that start with a newline and
indentation) through the router to emulated workers serving a model directory whose tokenizer
carries a Qwen3-Coder-style chat template: the workers render every prompt with that template as
SGLang 0.5.23 does, and the router is given the same directory. Every follow-up should stay on
its session's worker with the previous prompt cached."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp

from smetric_router.launch import ClusterSpec, RouterSpec, Stack, WorkerSpec
from smetric_router.launch.tiny_model import ensure_tiny_model
from tests.e2e.conftest import ROUTER_ARGS, SPEEDUP

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the repository.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


async def _session(http: aiohttp.ClientSession, url: str, model: str, s: int) -> list[Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"You are coding agent {s}. " * 30},
        {"role": "user", "content": f"Fix bug {s} in the repository."},
    ]
    follow_ups = []
    for turn in range(4):
        body = {"model": model, "messages": messages, "tools": TOOLS, "max_tokens": 16}
        async with http.post(f"{url}/v1/chat/completions", json=body) as r:
            assert r.status == 200, await r.text()
            out = await r.json()
            worker, reason = r.headers.get("x-smetric-worker"), r.headers.get("x-smetric-reason")
        usage = out["usage"]
        if turn:
            follow_ups.append((reason, worker, usage["prompt_tokens_details"]["cached_tokens"]))
        arguments = json.dumps({"path": f"m{turn}.py"})
        call = {"id": f"c{turn}", "function": {"name": "read_file", "arguments": arguments}}
        messages += [
            {"role": "assistant", "content": out["choices"][0]["message"]["content"],
             "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{turn}",
             "content": "\n    def f():\n        return 1\n" * 4},
        ]  # fmt: skip
    return follow_ups


async def test_agent_follow_ups_stick_with_the_model_template(tmp_path: Path) -> None:
    model_dir = str(ensure_tiny_model(tmp_path / "tiny-qwen3"))
    spec = ClusterSpec(
        router=RouterSpec(
            port=0, policy="smetric", extra_args=(*ROUTER_ARGS, "--tokenizer-path", model_dir)
        ),
        workers=WorkerSpec(count=2, speedup=SPEEDUP, extra_args=("--tokenizer-path", model_dir)),
    )
    stack = Stack(spec)
    try:
        stack.start()
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{stack.url}/v1/models") as r:
                model = (await r.json())["data"][0]["id"]
            sessions = await asyncio.gather(
                *(_session(http, stack.url, model, s) for s in range(6))
            )
    finally:
        stack.stop()
    follow_ups = [f for s in sessions for f in s]
    assert [reason for reason, _, _ in follow_ups] == ["sticky"] * len(follow_ups), follow_ups
