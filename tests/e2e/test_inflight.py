"""bench_serving's concurrent rounds through a launched stack: round 2 of a raw-prompt session is
sent while round 1 is still in flight (no KV event of it yet) and lands on round 1's worker."""

from __future__ import annotations

import aiohttp

from tests.e2e.conftest import StackFactory
from tests.e2e.raw import generate, token_ids
from tests.helpers.prometheus import value


async def test_round_sent_while_the_previous_is_in_flight_sticks(
    make_stack: StackFactory,
) -> None:
    # Real time (speedup 1): round 1's long prefill keeps its KV events away while round 2 routes.
    stack = make_stack(policy="smetric", workers=3, speedup=1.0)
    round_1 = token_ids(1, 6000)
    round_2 = round_1 + token_ids(2, 300)  # + the reply and the next user message
    body = {"input_ids": round_1, "sampling_params": {"max_new_tokens": 64}, "stream": True}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{stack.url}/generate", json=body) as first:
            # The head is out: round 1 was dispatched and is still running.
            assert first.status == 200
            home = first.headers["x-smetric-worker"]
            assert first.headers["x-smetric-reason"] == "first-turn-balance"
            assert await generate(http, stack.url, round_2) == (home, "sticky")
            await first.read()
        async with http.get(f"{stack.url}/metrics") as r:
            metrics = await r.text()
    # The in-flight view, not a KV event, put round 1's pages on its worker.
    raised = value(metrics, "smetric_inflight_prefix_views_total")
    assert raised is not None and raised >= 1, metrics
