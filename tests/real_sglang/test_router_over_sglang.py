"""The router over 2 real SGLang 0.5.23 workers (CPU, tiny random model), end to end.

Everything the workers report here is SGLang's own: prompt and cached token counts, KV events,
the patched per-tier probe, /flush_cache. The tests run in definition order on one shared stack;
the last one kills a worker.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import urllib.error
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from smetric_router.features.chat_tokenizer import load_chat_tokenizer
from smetric_router.features.extract import FeatureExtractor
from smetric_router.launch import Stack, free_port
from smetric_router.launch.kinds.sglang import model_path, sglang_python, tokenizer_path
from smetric_router.launch.spec import SglangSpec
from tests.helpers.polling import eventually_sync
from tests.real_sglang.conftest import MODEL, flush, is_ready, post_json

pytestmark = pytest.mark.sglang

PAGE = 16
SYSTEM = "You are a coding agent. You read files, run tools and edit code until the task is done. "


def _task(sid: int, words: int) -> str:
    vocab = ["read", "file", "src", "main", "test", "error", "line", "def", "class", "return"]
    return f"Task {sid}: " + " ".join(vocab[(sid * 7 + i * 3) % len(vocab)] for i in range(words))


# --- chat through the router -------------------------------------------------------------------


async def test_openai_client_chat_streaming_and_not(sglang_stack: Stack) -> None:
    flush(sglang_stack)
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Reverse a linked list in Python."},
    ]
    async with AsyncOpenAI(base_url=f"{sglang_stack.url}/v1", api_key="none",
                           max_retries=0) as client:  # fmt: skip
        assert MODEL in [m.id for m in (await client.models.list()).data]
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=8
        )
        assert raw.headers["x-smetric-worker"] in sglang_stack.worker_urls
        assert raw.headers["x-smetric-reason"] == "first-turn-balance"
        reply = raw.parse()
        assert reply.usage is not None and reply.usage.completion_tokens == 8
        assert reply.usage.prompt_tokens > 20 and reply.choices[0].message.content

        raw_stream = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=8, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        chunks = [c async for c in raw_stream.parse()]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        usage = next(c.usage for c in chunks if c.usage)
        assert text and usage.completion_tokens == 8
        # the same prompt again (another first turn, so balanced): where it landed on the worker
        # that served it before, SGLang itself reports the prompt cached, page-aligned
        same = raw_stream.headers["x-smetric-worker"] == raw.headers["x-smetric-worker"]
        details = usage.prompt_tokens_details
        assert details is not None
        assert details.cached_tokens == (usage.prompt_tokens // PAGE * PAGE if same else 0)

        # One model served: any name is served, as SGLang itself does ("default" is common).
        other = await client.chat.completions.create(
            model="default", messages=messages, max_tokens=2
        )
        assert other.choices[0].message.content is not None


async def test_sessions_stick_with_their_history_cached(sglang_stack: Stack) -> None:
    """10 sessions x 4 turns: first turns balanced, follow-ups sticky, and SGLang's own
    cached_tokens cover at least the previous prompt (page-aligned) on every follow-up.

    Each worker's sessions fit its device tier (MAX_TOTAL_TOKENS) with room to spare: under
    pressure SGLang evicts to the host tier and may not load a page back (a CI run once came
    back one page short at 93 % token usage with 16 sessions), which says nothing of routing.
    Alone, even beside two busy processes, the workers end with ~3,300 of 6,144 tokens held, so
    nothing is evicted; a run of the whole suite still came back one page short once at 10
    sessions. A short follow-up's message therefore carries the router's `x-smetric-hit` for it:
    what SGLang's own KV events said the worker held when the request was routed, so the next
    failure tells a page SGLang evicted before the request from one it held and did not use."""
    flush(sglang_stack)
    records: list[
        tuple[int, int, str, str, int, int, str]
    ] = []  # sid, turn, worker, reason, cached, hist, the router's view of the worker's hit

    async def session(client: AsyncOpenAI, sid: int) -> None:
        # a task long enough that no bunching of the 10 sessions makes a move worth it to the
        # default policy's cost guard (a follow-up brings under 48 new tokens, times at most 10
        # requests on its holder, against twice the 500-odd tokens a move would prefill), short
        # enough that 6 sessions (~750 tokens each by the last turn) fit one worker's device tier
        messages: list[Any] = [
            {"role": "system", "content": SYSTEM * 3},
            {"role": "user", "content": _task(sid, 400)},
        ]
        history = 0
        for turn in range(4):
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=messages, max_tokens=8
            )
            reply = raw.parse()
            assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
            cached = reply.usage.prompt_tokens_details.cached_tokens or 0
            records.append((sid, turn, raw.headers["x-smetric-worker"],
                            raw.headers["x-smetric-reason"], cached, history,
                            raw.headers.get("x-smetric-hit", "")))  # fmt: skip
            history = reply.usage.prompt_tokens // PAGE * PAGE
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            messages.append({"role": "user", "content": f"Tool result {turn}: 3 passed, 1 failed"})

    async with AsyncOpenAI(base_url=f"{sglang_stack.url}/v1", api_key="none",
                           max_retries=0) as client:  # fmt: skip
        await asyncio.gather(*(session(client, s) for s in range(10)))

    assert len(records) == 40
    first = {sid: w for sid, turn, w, *_ in records if turn == 0}
    per_worker = Counter(first.values())
    assert set(per_worker) == set(sglang_stack.worker_urls) and min(per_worker.values()) >= 4, (
        per_worker
    )
    follow = [r for r in records if r[1] > 0]
    assert Counter(r[3] for r in follow) == {"sticky": 30}, Counter(r[3] for r in follow)
    moved = [r for r in follow if r[2] != first[r[0]]]
    assert not moved, moved
    short = [(sid, turn, cached, hist, seen)
             for sid, turn, _, _, cached, hist, seen in follow if cached < hist]  # fmt: skip
    assert not short, short


TOOLS: list[Any] = [{"type": "function", "function": {
    "name": "run", "description": "Run a shell command in the repository",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string",
                                                            "description": "the command"}}},
}}]  # fmt: skip


async def test_agent_requests_with_tools_are_served(sglang_stack: Stack) -> None:
    """What coding agents send (tool definitions, assistant tool calls, tool results starting with
    a newline and indentation) goes through the router to SGLang's template and back."""
    flush(sglang_stack)
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Run the tests and fix what fails."},
    ]
    async with AsyncOpenAI(base_url=f"{sglang_stack.url}/v1", api_key="none",
                           max_retries=0) as client:  # fmt: skip
        for turn in range(3):
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=messages, tools=TOOLS, max_tokens=8
            )
            reply = raw.parse()
            assert reply.usage is not None and reply.usage.completion_tokens == 8
            # the template put the tool definitions in the system turn: the prompt grew by them
            assert reply.usage.prompt_tokens > 100
            call = {
                "id": f"call_{turn}",
                "type": "function",
                "function": {"name": "run", "arguments": f'{{"cmd": "pytest -k t{turn}"}}'},
            }
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            messages.append({"role": "tool", "tool_call_id": f"call_{turn}",
                             "content": f"\n    FAILED tests/test_{turn}.py::test_x"})  # fmt: skip


async def test_agent_sessions_with_tools_stick(sglang_stack: Stack) -> None:
    """Agent-shaped requests (tools in the system turn, tool calls, tool results starting with a
    newline and indentation): the router's prompt ids are the worker's own (SGLang returns them
    with return_prompt_token_ids), every follow-up sticks, and for those ids the router's
    KV-event index says what each worker's radix tree says."""
    flush(sglang_stack)
    chat = load_chat_tokenizer(tokenizer_path(sglang_stack.spec.sglang))
    features = FeatureExtractor(chat, page_size=PAGE)
    reasons, last_ids = [], []
    async with AsyncOpenAI(base_url=f"{sglang_stack.url}/v1", api_key="none",
                           max_retries=0) as client:  # fmt: skip
        for sid in range(4):
            messages: list[Any] = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": _task(sid, 40)},
            ]
            for turn in range(3):
                raw = await client.chat.completions.with_raw_response.create(
                    model=MODEL, messages=messages, tools=TOOLS, max_tokens=8,
                    extra_body={"return_prompt_token_ids": True},
                )  # fmt: skip
                reasons.append(raw.headers["x-smetric-reason"])
                worker_ids = raw.http_response.json()["choices"][0]["prompt_token_ids"]
                body = {"model": MODEL, "messages": messages, "tools": TOOLS}
                assert features.prompt_token_ids(body) == worker_ids, (sid, turn)
                last_ids = worker_ids
                call = {
                    "id": f"c{turn}",
                    "type": "function",
                    "function": {"name": "run", "arguments": '{"cmd": "make test"}'},
                }
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
                messages.append({"role": "tool", "tool_call_id": f"c{turn}",
                                 "content": f"\n  {turn} failed"})  # fmt: skip
    assert reasons.count("sticky") == 8, reasons
    views = eventually_sync(
        _views_agree(sglang_stack, [last_ids]), "index == probe for the last request's ids"
    )
    # the last request's worker holds its whole prompt (page-aligned) on the device tier
    assert max(v[0][0] for v in views.values()) == len(last_ids) // PAGE * PAGE, views


# --- the router's KV-event index against the workers' own probe --------------------------------


def _ids(seed: int, n: int) -> list[int]:
    # token ids in the tiny model's ordinary vocabulary (3 special tokens, 8192 in all)
    return [3 + (seed * 7919 + i * 104729) % 8000 for i in range(n)]


def _generate(url: str, ids: list[int]) -> None:
    out = post_json(url + "/generate", {"input_ids": ids,
                                         "sampling_params": {"max_new_tokens": 1}})  # fmt: skip
    assert out["meta_info"]["prompt_tokens"] == len(ids)


def _probe(worker: str, prompts: list[list[int]]) -> list[tuple[int, int]]:
    out = post_json(worker + "/smetric/prefix_match", {"input_ids": prompts})
    assert out["page_size"] == PAGE
    return [(r["device"], r["host"]) for r in out["results"]]


def _index(stack: Stack, prompts: list[list[int]]) -> dict[str, list[tuple[int, int]]]:
    out = post_json(stack.url + "/smetric/prefix_match", {"input_ids": prompts})
    return {w: [(r[w]["device"], r[w]["host"]) for r in out["results"]] for w in stack.worker_urls}


def _views_agree(stack: Stack, prompts: list[list[int]]) -> Callable[[], Any]:
    def check() -> Any:
        probe = {w: _probe(w, prompts) for w in stack.worker_urls}
        index = _index(stack, prompts)
        return probe if probe == index else False

    return check


def test_kv_index_equals_the_patched_probe_per_tier(sglang_stack: Stack) -> None:
    """After inserts, evictions to the host tier and /flush_cache, the router's index (from
    SGLang's KV events) says exactly what each worker's own radix tree says, tier by tier."""
    flush(sglang_stack)
    w0, w1 = sglang_stack.worker_urls
    a, b, c = _ids(1, 600), _ids(2, 600), _ids(3, 600)
    prompts = [a, a[:300], a + _ids(9, 40), b, c]
    _generate(w0, a)
    _generate(w0, b)
    _generate(w1, c)
    views = eventually_sync(_views_agree(sglang_stack, prompts), "index == probe after inserts")
    assert views[w0][0] == (592, 592) and views[w0][1] == (288, 288)
    assert views[w1][4] == (592, 592) and views[w1][0] == (0, 0)

    # push a and b out of w0's device tier (6,144-token pool) into its host tier
    for seed in range(10, 22):
        _generate(w0, _ids(seed, 600))
    views = eventually_sync(_views_agree(sglang_stack, prompts), "index == probe after evictions")
    device, host = views[w0][0]
    assert device < 592 and host == 592, views[w0]

    # a host hit is loaded back to the device and reported as cached by SGLang
    out = post_json(w0 + "/generate", {"input_ids": a, "sampling_params": {"max_new_tokens": 1}})
    assert out["meta_info"]["cached_tokens"] >= 592 - device
    eventually_sync(_views_agree(sglang_stack, prompts), "index == probe after a host hit")

    flush(sglang_stack)
    views = eventually_sync(_views_agree(sglang_stack, prompts), "index == probe after flush")
    assert all(v == (0, 0) for per in views.values() for v in per)


# --- --cache-view probe --------------------------------------------------------------------


@pytest.fixture
def probe_router(sglang_stack: Stack) -> Iterator[str]:
    port = free_port()
    argv = [sys.executable, "-m", "smetric_router", "--port", str(port), "--cache-view", "probe",
            "--probe-timeout-secs", "2", "--tokenizer-path", model_path(sglang_stack.spec.sglang),
            "--log-level", "warning", "--worker-urls", *sglang_stack.worker_urls]  # fmt: skip
    proc = subprocess.Popen(argv, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        eventually_sync(lambda: is_ready(url), "probe router ready", timeout=30)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


async def test_probe_cache_view_sticks_follow_ups(sglang_stack: Stack, probe_router: str) -> None:
    flush(sglang_stack)
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM * 3},
        {"role": "user", "content": _task(99, 80)},
    ]
    seen = []
    async with AsyncOpenAI(base_url=f"{probe_router}/v1", api_key="none",
                           max_retries=0) as client:  # fmt: skip
        for turn in range(3):
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=messages, max_tokens=8
            )
            reply = raw.parse()
            seen.append((raw.headers["x-smetric-worker"], raw.headers["x-smetric-reason"]))
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            messages.append({"role": "user", "content": f"Tool result {turn}: ok"})
    assert [r for _, r in seen] == ["first-turn-balance", "sticky", "sticky"], seen
    assert len({w for w, _ in seen}) == 1, seen


# --- the peers accept the same workers ---------------------------------------------------------


PEERS = {
    # python -m smg: .venv-sglang/bin/smg is sglang-router's script (both wheels ship one)
    "smg": ["{python}", "-m", "smg", "launch", "--policy", "cache_aware"],
    "sglang-router": ["{python}", "-m", "sglang_router.launch_router", "--policy", "cache_aware"],
}


@pytest.mark.parametrize("peer", sorted(PEERS))
def test_peer_routers_accept_the_workers(sglang_stack: Stack, peer: str) -> None:
    """smg 1.13 and sglang-router 0.3.2 take these workers as SGLang workers and route to them."""
    python = sglang_python(SglangSpec())
    port = free_port()
    argv = [a.format(bin=os.path.dirname(python), python=python) for a in PEERS[peer]]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--worker-urls",
             *sglang_stack.worker_urls]  # fmt: skip
    proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:

        def answer() -> Any:
            if proc.poll() is not None:
                pytest.fail(f"{peer} exited with {proc.returncode}")
            try:
                return post_json(url + "/v1/chat/completions", {
                    "model": MODEL, "max_tokens": 4,
                    "messages": [{"role": "user", "content": f"hello from {peer}"}],
                }, timeout=10)  # fmt: skip
            except (urllib.error.URLError, OSError):
                return None

        reply = eventually_sync(answer, f"{peer} answers a chat completion", timeout=60)
        assert reply["usage"]["completion_tokens"] == 4 and reply["choices"][0]["message"]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


# --- a worker dies mid-stream (last: it takes a worker away) ---------------------------------


async def test_worker_killed_mid_stream_ends_the_stream_cleanly(sglang_stack: Stack) -> None:
    flush(sglang_stack)
    body = {
        "model": MODEL, "max_tokens": 400, "stream": True,
        "messages": [{"role": "user", "content": "Write a long essay about radix trees."}],
        "ignore_eos": True,
    }  # fmt: skip
    async with aiohttp.ClientSession() as http:
        async with http.post(sglang_stack.url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200
            victim = r.headers["x-smetric-worker"]
            child = next(c for c in sglang_stack.children
                         if c.ready_url.startswith(victim))  # fmt: skip
            assert child.proc is not None
            lines = []
            killed = False
            async for raw in r.content:
                line = raw.decode().strip()
                if not line:
                    continue
                lines.append(line)
                if not killed and len(lines) >= 3:
                    os.killpg(child.proc.pid, signal.SIGKILL)
                    killed = True
        assert killed and lines[-1] == "data: [DONE]", lines[-3:]
        assert any('"error"' in line for line in lines[-3:]), lines[-3:]

        # the router keeps serving on the surviving worker
        survivor = next(u for u in sglang_stack.worker_urls if u != victim)
        small = {"model": MODEL, "max_tokens": 4,
                 "messages": [{"role": "user", "content": "still there?"}]}  # fmt: skip
        for _ in range(3):
            async with http.post(sglang_stack.url + "/v1/chat/completions", json=small) as r:
                assert r.status == 200, await r.text()
                assert r.headers["x-smetric-worker"] == survivor
