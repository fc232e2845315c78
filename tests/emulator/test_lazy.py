"""The emulated worker draws an answer as it is emitted, so max_tokens costs no memory up front
(`max_tokens: 1e9` once OOM-killed a worker that built the whole answer first), and it refuses
what SGLang 0.5.23 refuses against the model's context length (tokenizer_manager's checks)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import orjson

from smetric_router.core.port_file import read_port_file
from smetric_router.emulator.answer import BLOCK, make_answer
from smetric_router.emulator.tokenizer import load_tokenizer
from tests.emulator.conftest import make_config, serving
from tests.helpers.polling import eventually, eventually_sync

MB = 1 << 20


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@contextmanager
def emulator(tmp_path: Path, *args: str) -> Iterator[tuple[str, int]]:
    """An emulated worker process on a free port: (url, pid)."""
    port_file = tmp_path / "ports.json"
    argv = [
        sys.executable,
        "-m",
        "smetric_router.emulator",
        "--port",
        "0",
        "--speedup",
        "50",
        "--log-level",
        "warning",
        "--port-file",
        str(port_file),
        *args,
    ]
    proc = subprocess.Popen(argv)

    def reported() -> dict[str, int] | None:
        assert proc.poll() is None, f"emulator exited with {proc.returncode}"
        return read_port_file(port_file)

    try:
        ports = eventually_sync(reported, "the emulator's ports", 60)
        yield f"http://127.0.0.1:{ports['http']}", proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=15)


async def _running(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(url + "/v1/loads") as r:
        return int((await r.json())["loads"][0]["num_running_reqs"])


async def test_a_billion_max_tokens_streams_without_memory_and_can_be_cut(tmp_path: Path) -> None:
    # a context and a KV pool that let the request run: only the answer's drawing is at stake
    big = str(2_000_000_000)
    with emulator(tmp_path, "--context-length", big, "--gpu-kv-tokens", big) as (url, pid):
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/v1/models") as r:
                assert (await r.json())["data"][0]["max_model_len"] == 2_000_000_000
            before = rss(pid)
            body = {"prompt": "Count to a billion.", "max_tokens": 1e9, "ignore_eos": True,
                    "stream": True}  # fmt: skip
            words = 0
            started = time.monotonic()
            async with http.post(url + "/v1/completions", json=body) as r:
                assert r.status == 200, await r.text()
                async for line in r.content:
                    if line.startswith(b"data: {"):
                        words += len(orjson.loads(line[6:])["choices"][0]["text"].split())
                    if words >= 3 * BLOCK:
                        break
                assert time.monotonic() - started < 30
                assert await _running(http, url) == 1
                grown = rss(pid) - before

            # the client went away mid-stream: the worker drops the request and serves on
            async def dropped() -> bool:
                return not await _running(http, url)

            await eventually(dropped, "the cut stream's request dropped", 10)
            async with http.get(url + "/health") as r:
                assert r.status == 200
            small = {"prompt": "Again.", "max_tokens": 8}
            async with http.post(url + "/v1/completions", json=small) as r:
                assert r.status == 200
                assert (await r.json())["usage"]["completion_tokens"] == 8
    assert grown < 40 * MB, f"the worker grew {grown / MB:.0f} MB for a 1e9-token answer"


def test_an_answer_is_drawn_as_far_as_it_is_read() -> None:
    tok = load_tokenizer()
    answer = make_answer(tok, [1, 2, 3], 10**9, None, end_turn=True, natural=False)
    assert len(answer.output_ids) == 10**9
    first = answer.output_ids[:5]
    assert len(answer.drawn(0)) == BLOCK  # one block drawn, not the answer
    text = answer.text_at(5)
    assert tok.encode(text) == first
    # the same draw whatever is read first, and blocks joined encode to their ids
    again = make_answer(tok, [1, 2, 3], 10**9, None, end_turn=True, natural=False)
    assert again.text_between(0, 3 * BLOCK) == answer.text_at(3 * BLOCK)
    assert tok.encode(again.text_at(3 * BLOCK)) == answer.output_ids[: 3 * BLOCK]
    short = make_answer(tok, [1, 2, 3], 4, None, end_turn=True, natural=False)
    assert list(short.output_ids) == [*short.output_ids[:3], tok.end_of_turn_id]
    assert short.text_at(10) == short.text_at(3)
    assert short.first_token().output_ids[:] == short.output_ids[:1]


async def test_max_tokens_past_the_context_is_refused_as_sglang_does() -> None:
    async with serving(make_config(context_length=64)) as w:
        status, models = await w.get("/v1/models")
        assert models["data"][0]["max_model_len"] == 64
        chat = {"messages": [{"role": "user", "content": "hi"}]}
        status, body = await w.post("/v1/chat/completions", {**chat, "max_tokens": 1e9})
        assert status == 400
        assert body["message"] == (
            "max_completion_tokens is too large: 1000000000.This model supports at most 64 "
            "completion tokens."
        )
        status, body = await w.post("/v1/chat/completions", {**chat, "max_tokens": 60})
        assert status == 400
        assert body["message"].startswith(
            "Requested token count exceeds the model's maximum context length of 64 tokens. "
            "You requested a total of "
        )
        status, body = await w.post("/generate", {"input_ids": [5] * 64})
        assert status == 400
        assert body == {
            "error": {
                "message": "The input (64 tokens) is longer than the model's context length "
                "(64 tokens)."
            }
        }
        status, body = await w.post(
            "/generate", {"input_ids": [5] * 60, "sampling_params": {"max_new_tokens": 5}}
        )
        assert status == 400 and "a total of 65 tokens: 60 tokens" in body["error"]["message"]
        # without max_new_tokens SGLang checks the prompt only (the default, 128, is not)
        status, body = await w.post("/generate", {"input_ids": [5] * 60})
        assert status == 200 and body["meta_info"]["completion_tokens"] == 128
