"""--cache-view probe: ask each worker how much of the prompt it holds (patched SGLang's
POST /smetric/prefix_match, see patches/), instead of reading the KV-event index.

One round per request, gathered over the healthy candidates with a short timeout; a worker that
fails or does not answer in time counts as holding nothing for this decision.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

import aiohttp
import orjson

from smetric_router.router.metrics import RouterMetrics

log = logging.getLogger(__name__)

PROBE_PATH = "/smetric/prefix_match"
_JSON = {"Content-Type": "application/json"}


class Prober:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        timeout_secs: float,
        metrics: RouterMetrics,
        headers: Mapping[str, str] | None = None,  # the worker key, if any
    ) -> None:
        self._session = session
        self._headers = {**_JSON, **(headers or {})}
        self._timeout = aiohttp.ClientTimeout(total=timeout_secs)
        self._metrics = metrics

    async def hits(
        self, token_ids: Sequence[int], urls: Sequence[str]
    ) -> Mapping[str, tuple[int, int]]:
        """url -> (GPU hit, GPU-or-host hit) in tokens, as HitIndex.match reports them."""
        body = orjson.dumps({"input_ids": [list(token_ids)]})
        answers = await asyncio.gather(*(self._ask(url, body) for url in urls))
        return dict(zip(urls, answers, strict=True))

    async def _ask(self, url: str, body: bytes) -> tuple[int, int]:
        try:
            async with self._session.post(
                url + PROBE_PATH, data=body, headers=self._headers, timeout=self._timeout
            ) as r:
                if r.status != 200:
                    raise ValueError(f"HTTP {r.status}")
                (result,) = orjson.loads(await r.read())["results"]
                device, host = result["device"], result["host"]
                if type(device) is not int or not (host is None or type(host) is int):
                    raise ValueError(f"malformed result {result!r}")
                # host is null where the worker's tree has no read-only host walk.
                return device, device if host is None else max(device, host)
        except asyncio.TimeoutError:
            outcome = "timeout"
        except (aiohttp.ClientError, ValueError, KeyError, TypeError) as e:
            outcome = "error"
            log.debug("cache probe of %s failed: %s", url, e)
        log.debug("cache probe of %s: %s, counted as hit 0", url, outcome)
        self._metrics.probe_failures.labels(url, outcome).inc()
        return 0, 0
