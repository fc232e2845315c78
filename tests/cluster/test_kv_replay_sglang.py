"""The warm-start replay against real SGLang 0.5.23's ZmqEventPublisher (no server: the class
alone, in .venv-sglang). With 50,000 batches published and its default 10,000-batch buffer, its
replay answers 40,000..49,999 in one burst on a ROUTER socket with ZMQ's default send HWM; the
feed must end up with all of it, as a partial history."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from smetric_router.cluster.kv_index import KvIndex
from smetric_router.cluster.subscriber import FeedConfig, KvEventFeed
from smetric_router.launch.ports import free_ports
from tests.cluster.test_subscriber import PAGE, Worker, hits, make_worker
from tests.helpers.polling import eventually
from tests.sglang_env import require_sglang_python

__all__ = ["make_worker"]

pytestmark = pytest.mark.sglang

N = 50000
TOKENS = 256  # ~1 KB batches: enough that a 10,000-batch burst overruns ZMQ's default HWM

PUBLISHER = f"""
import sys, time
from sglang.srt.disaggregation.kv_events import BlockStored, KVEventBatch, ZmqEventPublisher
pub_port, replay_port = int(sys.argv[1]), int(sys.argv[2])
pub = ZmqEventPublisher(0, endpoint=f"tcp://127.0.0.1:{{pub_port}}",
                        replay_endpoint=f"tcp://127.0.0.1:{{replay_port}}", bind=True, topic="kv")
tokens = list(range({TOKENS}))
for i in range({N}):
    pub.publish(KVEventBatch(ts=0.0, events=[BlockStored(block_hashes=[i + 1],
        parent_block_hash=i if i else None, token_ids=tokens, block_size={TOKENS},
        lora_id=None, medium="GPU")]))
while pub._event_queue.qsize():
    time.sleep(0.05)
while len(pub._buffer) < pub._buffer.maxlen or pub._buffer[-1][0] != {N} - 1:
    time.sleep(0.05)
print("READY", flush=True)
sys.stdin.read()  # until the test closes it
pub.shutdown()
"""


async def test_warm_start_from_sglangs_publisher_gets_its_whole_buffer(
    make_worker: Callable[..., Any],
) -> None:
    python = require_sglang_python()
    pub_port, replay_port = free_ports(2)
    proc = subprocess.Popen(
        [str(python), "-c", PUBLISHER, str(pub_port), str(replay_port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=sys.stderr,
        text=True,
    )
    feed: KvEventFeed | None = None
    try:
        assert proc.stdout is not None
        t0 = time.monotonic()
        line = proc.stdout.readline()  # bounded by the test timeout; the process prints or dies
        assert line.strip() == "READY", f"publisher failed ({proc.poll()})"
        print(f"publisher ready after {time.monotonic() - t0:.1f} s")
        w: Worker = await make_worker(events=False)
        w.kv = {
            "publisher": "zmq",
            "endpoint_host": "127.0.0.1",
            "endpoint_port_base": pub_port,
            "replay_endpoint_port_base": replay_port,
            "topic": "kv",
            "block_size": PAGE,
            "dp_size": 1,
        }
        index = KvIndex()
        feed = KvEventFeed(w.url, index, config=FeedConfig(replay_timeout_s=1.0))
        t0 = time.monotonic()
        feed.start()
        await eventually(lambda: feed is not None and feed.last_seq == N - 1, "replayed", 30)
        print(f"warm start took {time.monotonic() - t0:.1f} s")
        assert feed.batches_applied == 10000 and feed.resets == 0
        # a chain whose first 40,000 pages were announced before the buffer's start: the index
        # holds the rest as a partial history and matches it by its deepest page
        chain = list(range(1, N + 1))
        assert hits(index, w.url, chain) == (N * PAGE, N * PAGE)
        assert hits(index, w.url, chain[:40000]) == (0, 0)
        assert index.stats(w.url).orphan_roots == 1
    finally:
        if feed is not None:
            await feed.stop()
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
