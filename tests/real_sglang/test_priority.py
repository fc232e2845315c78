"""--follow-up-priority on real SGLang 0.5.23 (one CPU worker started with
--enable-priority-scheduling --default-priority-value 0 --enable-metrics): the worker reads the
priority the router sets, and says so in its own TTFT histogram, which carries each request's
priority as a label under priority scheduling."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import openai
import pytest

from smetric_router.launch import Stack
from tests.helpers.prometheus import scrape, total
from tests.real_sglang.conftest import MODEL, sglang_spec
from tests.sglang_env import require_sglang_python

TTFT = "sglang:time_to_first_token_seconds_count"


@pytest.fixture(scope="module")
def priority_stack() -> Iterator[Stack]:
    require_sglang_python()
    spec = sglang_spec(workers=1, metrics=True)
    spec = replace(
        spec,
        router=replace(
            spec.router, extra_args=(*spec.router.extra_args, "--follow-up-priority", "1")
        ),
        workers=replace(
            spec.workers,
            extra_args=("--enable-priority-scheduling", "--default-priority-value", "0"),
        ),
    )
    with Stack(spec) as stack:
        yield stack


def test_sglang_serves_follow_ups_at_the_priority_the_router_sets(priority_stack: Stack) -> None:
    client = openai.OpenAI(base_url=priority_stack.url + "/v1", api_key="none", max_retries=0)
    history: list[Any] = [{"role": "user", "content": "List the files to change."}]
    reasons = []
    for turn in range(3):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=history, max_tokens=4, temperature=0
        )
        reasons.append(raw.headers["x-smetric-reason"])
        reply = raw.parse().choices[0].message.content or ""
        history += [{"role": "assistant", "content": reply},
                    {"role": "user", "content": f"Now step {turn + 1}."}]  # fmt: skip
    # the priority follows the turn the body shows, whatever the placement's reason (a follow-up
    # sent before its reply's KV events arrive can be an evicted-fallback on its own holder)
    assert reasons[0] == "first-turn-balance" and "first-turn-balance" not in reasons[1:]
    text = scrape(priority_stack.worker_urls[0])
    # the follow-ups asked the router's 1; the first turn none (the worker's default 0), as do
    # the worker's own health generations, so that count is only bounded below
    assert total(text, TTFT, priority="1") == 2
    assert total(text, TTFT, priority="0") >= 1
