"""The turn hint headers over HTTP: x-smetric-turn and x-smetric-history-tokens decide how a raw
prompt is routed, against what the workers' KV events say they hold."""

from __future__ import annotations

import aiohttp

from tests.e2e.conftest import StackFactory
from tests.e2e.raw import generate, token_ids, wait_indexed

TURN, HISTORY = "x-smetric-turn", "x-smetric-history-tokens"


async def test_turn_and_history_headers_steer_raw_prompts(make_stack: StackFactory) -> None:
    stack = make_stack(workers=2)
    prompt = token_ids(seed=1, n=640)  # 40 full pages
    async with aiohttp.ClientSession() as http:
        home, reason = await generate(http, stack.url, prompt)
        assert reason == "first-turn-balance"  # nobody holds it: inferred as a first request
        await wait_indexed(http, stack.url, home, prompt)

        follow = prompt + token_ids(seed=2, n=200)
        # A follow-up by the header alone (no history figure): sticks where the prompt is cached.
        assert await generate(http, stack.url, follow, {TURN: "1"}) == (home, "sticky")
        # Without any hint, home's exclusive hit makes it an inferred follow-up.
        assert await generate(http, stack.url, follow) == (home, "sticky")
        # With the history it carries: at least 640 cached > 0.5 x 640, so it sticks.
        hinted = {TURN: "2", HISTORY: "640"}
        assert await generate(http, stack.url, follow, hinted) == (home, "sticky")
        # x-smetric-turn: 0 overrides the inference: balanced like a first request.
        assert (await generate(http, stack.url, follow, {TURN: "0"}))[1] == "first-turn-balance"
        # Claiming more history than any worker holds (at most the follow-up's 832 tokens of
        # full pages): 832 <= 0.5 x 2000, so it looks evicted.
        claimed = {TURN: "2", HISTORY: "2000"}
        assert (await generate(http, stack.url, follow, claimed))[1] == "evicted-fallback"

        async with http.post(f"{stack.url}/generate", json={"input_ids": follow},
                             headers={TURN: "one"}) as r:  # fmt: skip
            assert r.status == 400
            assert TURN in (await r.json())["error"]["message"]
