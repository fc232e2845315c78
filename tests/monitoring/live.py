"""What the live tests start: Debian's Prometheus on loopback scraping a router, headless
Chromium opening a page, and traffic through the router (sessions over the OpenAI client)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from smetric_router.launch import free_port
from tests.helpers.polling import eventually_sync
from tests.monitoring.tools import RULES, require_chromium, require_tool

WINDOW = (1400, 900)
# Where the page draws its heatmap in a WINDOW-sized screenshot (CSS pixels = screenshot pixels):
# the first section's canvas, right of the worker names.
HEATMAP_BOX = (170, 82, 1370, 360)  # left, top, right, bottom


@contextlib.contextmanager
def prometheus(target: str, tmp: Path) -> Iterator[str]:
    """A Prometheus on 127.0.0.1 scraping `target` (host:port) every second, evaluating
    deploy/monitoring's rules every second; yields its base URL."""
    binary = require_tool("prometheus")
    port = free_port("127.0.0.1")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {"job_name": "smetric-router", "static_configs": [{"targets": [target]}]}
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = (tmp / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            assert proc.poll() is None, (tmp / "prometheus.log").read_text()
            try:
                with urllib.request.urlopen(url + "/-/ready", timeout=2) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        eventually_sync(ready, "Prometheus ready", timeout=60)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def query_range(base: str, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    """The series Prometheus' HTTP API answers for `expr` over [start, end] at 1 s steps."""
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": "1"})
    with urllib.request.urlopen(f"{base}/api/v1/query_range?{params}", timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def chromium(url: str, tmp: Path, screenshot: Path | None = None, budget_ms: int = 4000) -> str:
    """Open `url` headless for `budget_ms` of virtual time (the page's timers run); returns the
    DOM then, and writes a screenshot when asked."""
    binary = require_chromium()
    args = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--no-first-run", "--disable-extensions", f"--user-data-dir={tmp / 'chromium'}",
            f"--window-size={WINDOW[0]},{WINDOW[1]}",
            f"--virtual-time-budget={budget_ms}"]  # fmt: skip
    if screenshot is not None:
        done = subprocess.run([*args, f"--screenshot={screenshot}", url],
                              capture_output=True, timeout=120, check=False)  # fmt: skip
        assert done.returncode == 0 and screenshot.is_file(), done.stderr.decode()[-2000:]
    done = subprocess.run([*args, "--dump-dom", url], capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return done.stdout.decode()


def heatmap_spread(png: Path) -> tuple[float, int]:
    """The heatmap box's pixel standard deviation and its number of distinct colours."""
    import numpy as np
    from PIL import Image

    with Image.open(png) as img:
        box = np.asarray(img.convert("RGB").crop(HEATMAP_BOX), dtype=np.float64)
    colours = len({tuple(p) for p in box.reshape(-1, 3)[::7].astype(int).tolist()})
    return float(box.std()), colours


async def sessions(base_url: str, model: str, count: int, turns: int) -> int:
    """`count` chat sessions of `turns` turns each, concurrently, plus one follow-up whose history
    no worker holds (an evicted-fallback); returns the requests sent."""
    async with AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0) as client:

        async def session(i: int) -> None:
            messages: list[ChatCompletionMessageParam] = [
                {"role": "user", "content": f"Session {i}: refactor module {i}. " * 30}
            ]
            for turn in range(turns):
                r = await client.chat.completions.create(
                    model=model, messages=messages, max_tokens=48
                )
                messages.append({"role": "assistant", "content": r.choices[0].message.content})
                messages.append({"role": "user", "content": f"Now step {turn} of session {i}."})

        await asyncio.gather(*(session(i) for i in range(count)))
        lost: list[ChatCompletionMessageParam] = [
            {"role": "user", "content": "A session this router never saw. " * 40},
            {"role": "assistant", "content": "An answer no worker has cached. " * 20},
            {"role": "user", "content": "Go on."},
        ]
        await client.chat.completions.create(model=model, messages=lost, max_tokens=8)
    return count * turns + 1


@contextlib.contextmanager
def busy(base_url: str, model: str) -> Iterator[None]:
    """Chat sessions sent one batch after another until the block ends, so that the router has
    requests in flight whenever Prometheus scrapes it: a rule over the workers' load has no
    sample on an idle cluster, and on a loaded machine the scrapes during one short burst can all
    come too late."""
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            asyncio.run(sessions(base_url, model, count=4, turns=2))

    thread = threading.Thread(target=run, name="busy", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=60)
