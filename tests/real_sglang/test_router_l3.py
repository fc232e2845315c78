"""The router's L3 view over 2 real SGLang 0.5.23 workers with Mooncake as HiCache's L3 (CPU, tiny
model; conftest's shared `mooncake_stack`, whose router runs `--l3-view master` as the launcher
sets it for a `global_tier: mooncake` cluster).

- What the router reports in L3 for a prompt equals what the master holds for it (the master's own
  HTTP API, asked before the request, with the store quiet).
- A session whose worker flushed its cache and left is served by the other worker from L3: the
  router says `tier=l3` and SGLang's cached_tokens_details show the storage hit.
- The master killed and restarted mid-run: every request answered, `l3=unknown` while it is down,
  the outage and the reset in the router's metrics. (Last in this file: the store is empty after.)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

from smetric_router.core.mooncake_keys import page_stems
from smetric_router.features.chat_tokenizer import load_chat_tokenizer
from smetric_router.features.extract import FeatureExtractor
from smetric_router.launch import Stack
from smetric_router.launch.kinds.sglang import tokenizer_path
from smetric_router.launch.stack import MASTER
from tests.helpers.polling import eventually_sync
from tests.helpers.prometheus import metric
from tests.real_sglang.conftest import MODEL, PAGE, get_json, is_ready, post_json

pytestmark = pytest.mark.sglang

SYSTEM = "You are a coding agent working in a large repository; answer with one tool call. " * 12


def master_url(stack: Stack) -> str:
    m = stack.spec.mooncake
    assert m is not None
    return f"http://{m.host}:{m.metrics_port}"


def leading_in_master(stack: Stack, digests: bytes) -> int:
    """Leading pages whose K and V objects the master holds, from its own /batch_query_keys."""
    n = 0
    for stem in page_stems(MODEL, digests, 0):
        keys = urllib.parse.quote(f"{stem}_k,{stem}_v", safe=",")
        with urllib.request.urlopen(f"{master_url(stack)}/batch_query_keys?keys={keys}") as r:
            data = json.load(r)["data"]
        if not all(v["ok"] for v in data.values()):
            break
        n += 1
    return n


def quiet_store(stack: Stack, timeout: float = 60) -> None:
    """Wait until the master's key count stops moving (write-through of earlier requests done)."""
    deadline, last, stable = time.monotonic() + timeout, -1.0, 0
    while time.monotonic() < deadline and stable < 3:
        count = metric(master_url(stack), "master_key_count")
        stable = stable + 1 if count == last else 0
        last = count
        time.sleep(0.5)
    assert stable >= 3, "the store kept changing"


def chat(
    stack: Stack, messages: list[ChatCompletionMessageParam]
) -> tuple[dict[str, str], ChatCompletion]:
    client = OpenAI(base_url=stack.url + "/v1", api_key="-", max_retries=0, timeout=180)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0,
        extra_body={"return_cached_tokens_details": True},
    )  # fmt: skip
    reply = raw.parse()
    keys = ("x-smetric-worker", "x-smetric-reason", "x-smetric-hit", "x-smetric-tier")
    return {k: raw.headers[k] for k in keys}, reply


def l3_of(headers: dict[str, str]) -> str:
    m = re.search(r"l3=(\w+)", headers["x-smetric-hit"])
    assert m, headers
    return m.group(1)


def features(stack: Stack) -> FeatureExtractor:
    chat_tok = load_chat_tokenizer(tokenizer_path(stack.spec.sglang), None)
    return FeatureExtractor(chat_tok, PAGE, keep_digests=True)


def test_router_l3_view_equals_the_masters_contents(mooncake_stack: Stack) -> None:
    stack = mooncake_stack
    conv: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Session A: find the failing test."},
    ]
    headers, reply = chat(stack, conv)
    conv += [{"role": "assistant", "content": reply.choices[0].message.content},
             {"role": "user", "content": "Run it again with -x and show the output."}]  # fmt: skip
    quiet_store(stack)
    f = features(stack).from_chat({"model": MODEL, "messages": conv})
    expected = leading_in_master(stack, f.page_digests)
    assert expected >= 16  # the first turn's prompt was written through
    headers, _ = chat(stack, conv)
    assert l3_of(headers) == str(expected * PAGE), (headers, expected)


def test_session_whose_worker_flushed_and_left_is_served_elsewhere_from_l3(
    mooncake_stack: Stack,
) -> None:
    stack = mooncake_stack
    # Past the shared system prompt (which the other worker may hold from an earlier test) the
    # session's own part must be over SGLang's 256-token prefetch threshold, else the store is
    # not read whatever it holds.
    modules = ", ".join(f"pkg/cache_user_{i}.py" for i in range(60))
    conv: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Session B: which of these import the cache? {modules}"},
    ]
    headers, reply = chat(stack, conv)
    first = headers["x-smetric-worker"]
    conv += [{"role": "assistant", "content": reply.choices[0].message.content},
             {"role": "user", "content": "Open the first one."}]  # fmt: skip
    quiet_store(stack)
    flushed = urllib.request.Request(f"{first}/flush_cache", b"", method="POST")
    assert urllib.request.urlopen(flushed).status == 200
    req = urllib.request.Request(
        f"{stack.url}/workers?url={urllib.parse.quote(first, safe='')}", method="DELETE"
    )
    urllib.request.urlopen(req).read()
    try:
        headers, reply = chat(stack, conv)
    finally:
        post_json(stack.url + "/workers", {"url": first})
    assert headers["x-smetric-worker"] != first
    assert headers["x-smetric-tier"] == "l3", headers
    l3 = int(l3_of(headers))
    details = (reply.model_extra or {}).get("sglext", {}).get("cached_tokens_details") or {}
    # SGLang loaded the history from the store: its storage hit is what the router saw in L3
    # (less what the worker held locally: the shared system prompt, if it served it before).
    assert details.get("storage", 0) > 0, details
    assert details.get("storage", 0) + details.get("device", 0) + details.get("host", 0) >= l3
    usage = reply.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens
    assert cached is not None and cached >= l3


@contextmanager
def events_router(stack: Stack, tmp_path: Path) -> Iterator[str]:
    """A second router over the same workers whose L3 view is the fork's L3 KV events."""
    port_file = tmp_path / "router.ports"
    urls = [w.url for w in stack.workers]
    argv = [sys.executable, "-m", "smetric_router", "--port", "0", "--port-file", str(port_file),
            "--log-level", "warning", "--tokenizer-path", tokenizer_path(stack.spec.sglang),
            "--l3-view", "events", "--worker-urls", *urls]  # fmt: skip
    proc = subprocess.Popen(argv)

    def reported() -> bool:
        assert proc.poll() is None, "the events router exited"
        return port_file.exists()

    try:
        eventually_sync(reported, "the events router's port file", 60)
        url = f"http://127.0.0.1:{json.loads(port_file.read_text())['http']}"
        eventually_sync(lambda: is_ready(url), "the events router ready", 60)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def l3_answer(router: str, ids: list[int]) -> int | None:
    out = post_json(router + "/smetric/prefix_match", {"input_ids": ids, "model": MODEL})
    l3: int | None = out["l3"][0]
    return l3


def test_both_l3_sources_agree_with_the_master(mooncake_stack: Stack, tmp_path: Path) -> None:
    stack = mooncake_stack
    with events_router(stack, tmp_path) as events_url:
        conv: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Session D: rename the helper and fix its callers."},
        ]
        chat(stack, conv)
        quiet_store(stack)
        body = {"model": MODEL, "messages": conv}
        ids = features(stack).prompt_token_ids(body)
        f = features(stack).from_chat(body)
        held = leading_in_master(stack, f.page_digests) * PAGE
        assert held >= 16 * PAGE
        # the fork's L3 events (the write-through's events trail the store's ack)
        eventually_sync(lambda: l3_answer(events_url, ids) == held, "the L3 events' view", 30)
        assert l3_answer(stack.url, ids) == held  # the master's API


PROBE_IDS = list(range(100, 100 + 4 * PAGE))


def test_master_killed_and_restarted_mid_run(mooncake_stack: Stack) -> None:
    stack = mooncake_stack
    master = next(c for c in stack.children if c.name == MASTER and c.proc is not None)
    conv: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Session C: summarize the open issues."},
    ]
    seen: list[str] = []
    for turn in range(6):
        if turn == 2:  # master gone: its keys and its HTTP API with it
            assert master.proc is not None
            master.proc.kill()
            master.proc.wait(10)
            eventually_sync(lambda: metric(stack.url, "smetric_l3_known") == 0.0, "L3 unknown", 10)
        if turn == 4:
            stack.start_mooncake()
            eventually_sync(lambda: metric(stack.url, "smetric_l3_known") == 1.0, "L3 known", 30)
            # and a lookup answered: the first ones to the new master can outlast a request's
            # head on a loaded machine, which the header then reports as unknown
            eventually_sync(lambda: l3_answer(stack.url, PROBE_IDS) is not None, "L3 answered", 30)
        headers, reply = chat(stack, conv)  # answered whatever the store's state
        seen.append(l3_of(headers))
        conv += [{"role": "assistant", "content": reply.choices[0].message.content},
                 {"role": "user", "content": f"Next step {turn}."}]  # fmt: skip
    assert seen[2] == seen[3] == "unknown", seen
    assert seen[4] != "unknown" and seen[5] != "unknown", seen
    assert metric(stack.url, "smetric_l3_outages_total") >= 1
    assert metric(stack.url, "smetric_l3_resets_total") >= 1
    assert metric(stack.url, "smetric_l3_known") == 1.0
    workers = get_json(stack.url + "/workers")["workers"]
    assert all(w["healthy"] for w in workers), workers
