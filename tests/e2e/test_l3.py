"""The router's L3 view end to end with emulated workers on a real Mooncake store: a launched
`global_tier: mooncake` cluster (local mooncake_master, emulated workers with `--global-tier
mooncake`, router with `--l3-view master`), read through HTTP while the master is up, killed and
restarted. Every request is answered throughout.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam

from smetric_router.features.chat_tokenizer import load_chat_tokenizer
from smetric_router.features.extract import FeatureExtractor
from smetric_router.launch import RouterSpec, Stack, WorkerSpec
from smetric_router.launch.stack import MASTER
from tests.e2e.conftest import mooncake_stack
from tests.helpers.polling import eventually_sync
from tests.helpers.prometheus import metric, scrape, value

PAGE = 16
MODEL = WorkerSpec().model_name


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    args = ("--log-level", "warning", "--l3-budget-secs", "2", "--l3-cache-ttl-secs", "0")
    yield from mooncake_stack(RouterSpec(port=0, extra_args=args))


def chat(stack: Stack, messages: list[ChatCompletionMessageParam]) -> dict[str, str]:
    client = OpenAI(base_url=stack.url + "/v1", api_key="-", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=messages,
        max_tokens=4,
    )
    assert raw.parse().choices[0].message.content is not None
    return {k: raw.headers[k] for k in ("x-smetric-hit", "x-smetric-tier", "x-smetric-reason")}


def l3_of(headers: dict[str, str]) -> str:
    m = re.search(r"l3=(\w+)", headers["x-smetric-hit"])
    assert m, headers
    return m.group(1)


def test_router_reports_l3_hits_unknown_during_an_outage_and_resets_after_a_restart(
    stack: Stack,
) -> None:
    conv: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "You are a careful coding agent. " * 40},
        {"role": "user", "content": "List the files in the repository."},
    ]
    extractor = FeatureExtractor(load_chat_tokenizer(None, None), PAGE)
    body = {"model": MODEL, "messages": conv}
    ids = extractor.prompt_token_ids(body)
    full = len(ids) // PAGE * PAGE

    def router_l3() -> Any:
        req = urllib.request.Request(
            stack.url + "/smetric/prefix_match",
            orjson.dumps({"input_ids": ids, "model": MODEL}),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req) as r:
            return orjson.loads(r.read())["l3"][0]

    # Nothing in L3 yet: a miss (0), not unknown. The worker then writes the prompt through.
    assert l3_of(chat(stack, conv)) == "0"
    eventually_sync(lambda: router_l3() == full, "the prompt in the router's L3 view", 30)
    headers = chat(stack, conv)
    assert l3_of(headers) == str(full)
    assert metric(stack.url, "smetric_l3_known") == 1.0
    # the default policy does not read the tier's hit: asked beside the requests (the headers
    # above have it), not in their decisions' way
    text = scrape(stack.url)
    assert value(text, "smetric_decision_stage_seconds_count", stage="decide") == 2
    assert value(text, "smetric_decision_stage_seconds_count", stage="l3") is None

    # Master down: requests still answered, L3 'unknown', the outage in the metrics.
    master = next(c for c in stack.children if c.name == MASTER and c.proc is not None)
    assert master.proc is not None
    master.proc.kill()
    master.proc.wait(10)
    eventually_sync(lambda: metric(stack.url, "smetric_l3_known") == 0.0, "L3 unknown", 30)
    for _ in range(3):
        assert l3_of(chat(stack, conv)) == "unknown"
    assert metric(stack.url, "smetric_l3_outages_total") == 1.0

    # Master back, empty: the router's view resets and the prompt is a miss until rewritten.
    stack.start_mooncake()
    eventually_sync(lambda: metric(stack.url, "smetric_l3_known") == 1.0, "L3 known again", 30)
    assert metric(stack.url, "smetric_l3_resets_total") == 1.0
    assert router_l3() == 0
