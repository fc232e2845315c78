"""Native /generate requests for router tests: token ids and a POST that reads the decision."""

from __future__ import annotations

import random
from typing import Any

import aiohttp


def ids(seed: int, n: int) -> list[int]:
    """n token ids, the same for the same seed: prompts that share nothing unless built to."""
    rng = random.Random(seed)
    return [rng.randrange(1000, 30000) for _ in range(n)]


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, str]:
    """The status and the worker the router named (x-smetric-worker; "" when it named none)."""
    async with http.post(url, json=body) as resp:
        await resp.read()
        return resp.status, resp.headers.get("x-smetric-worker", "")
