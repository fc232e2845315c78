"""The fork's L3 KV events from a live SGLang 0.5.23 worker with Mooncake as HiCache's L3 (CPU, tiny
model, page 16; conftest's shared `mooncake_stack`, patch set applied).

A plain ZMQ subscriber on the first worker's KV-event stream, decoding with the router's own
schema (smetric_router.core.kv_events): a 385-token prompt's 24 pages arrive as BlockStored with
medium EXTERNAL once the write-through to the store completed, for exactly the pages a separate
pure Mooncake client finds in the master, under the int64 hashes, parents and token ids of the
device events of those pages. Clearing the storage backend through the worker's HTTP endpoint then
sends BlockRemoved(EXTERNAL) for every page the worker announced, and the master holds none.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

from smetric_router.core.kv_events import (
    EXTERNAL,
    GPU,
    BlockRemoved,
    BlockStored,
    decode_batch,
)
from smetric_router.features.hashing import page_hashes
from smetric_router.launch import Stack
from tests.real_sglang.conftest import PAGE, generate, get_json, l3_pages

pytestmark = pytest.mark.sglang

PAGES = 24  # 384 tokens: above HiCache's 256-token prefetch threshold
IDS = [2000 + (i * 53) % 5000 for i in range(PAGES * PAGE)] + [9]  # not test_mooncake's prompt
REPLAY_FROM_0 = [b"", (0).to_bytes(8, "big")]
LEASE_S = 11  # mooncake_master's default_kv_lease_ttl (10 s), and a margin


class Stream:
    """The worker's KV events as the router sees them: a SUB socket, batches decoded in order."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], url: str) -> None:
        kv = get_json(url + "/server_info")["kv_events"]
        self.endpoint = f"tcp://127.0.0.1:{kv['endpoint_port_base']}"
        self.replay_endpoint = f"tcp://127.0.0.1:{kv['replay_endpoint_port_base']}"
        self.ctx = ctx
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.setsockopt(zmq.RCVHWM, 0)
        mon = self.sub.get_monitor_socket(zmq.EVENT_CONNECTED)
        self.sub.connect(self.endpoint)
        try:
            assert mon.poll(10_000), "SUB socket did not connect"
            mon.recv_multipart()
        finally:
            self.sub.disable_monitor()
            mon.close(linger=0)
        time.sleep(0.5)  # the PUB side learns the subscription
        self.events: list[Any] = []

    def until(self, done: Callable[[list[Any]], bool], timeout: float = 60) -> list[Any]:
        deadline = time.monotonic() + timeout
        while not done(self.events):
            left = deadline - time.monotonic()
            assert left > 0, f"timed out; events so far: {self.events}"
            if self.sub.poll(int(min(left, 0.5) * 1000)):
                _topic, _seq, payload = self.sub.recv_multipart()
                self.events.extend(decode_batch(payload).events)
        return self.events

    def history(self) -> list[Any]:
        """Every event the worker published since it started, from its replay socket."""
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.RCVTIMEO, 10_000)
        dealer.connect(self.replay_endpoint)
        dealer.send_multipart(REPLAY_FROM_0)
        out: list[Any] = []
        try:
            while True:
                frames = dealer.recv_multipart()
                if int.from_bytes(frames[-2], "big", signed=True) == -1:
                    return out
                out.extend(decode_batch(frames[-1]).events)
        finally:
            dealer.close(linger=0)

    def close(self) -> None:
        self.sub.close(linger=0)


@pytest.fixture
def stream(mooncake_stack: Stack) -> Iterator[Stream]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    s = Stream(ctx, mooncake_stack.worker_urls[0])
    try:
        yield s
    finally:
        s.close()
        ctx.term()


def stored(events: list[Any], medium: str) -> list[BlockStored]:
    return [e for e in events if isinstance(e, BlockStored) and e.medium == medium]


def l3_hashes(events: list[Any]) -> set[int]:
    return {h for e in stored(events, EXTERNAL) for h in e.block_hashes}


def chain(events: list[BlockStored]) -> list[tuple[int, int | None, list[int]]]:
    """(hash, parent, page tokens) per page, in order."""
    out = []
    for e in events:
        for i, h in enumerate(e.block_hashes):
            parent = e.parent_block_hash if i == 0 else e.block_hashes[i - 1]
            out.append((h, parent, e.token_ids[i * PAGE : (i + 1) * PAGE]))
    return out


def test_l3_events_for_the_pages_the_master_holds(mooncake_stack: Stack, stream: Stream) -> None:
    want = page_hashes(IDS, PAGE)  # the router's own hashes of the prompt's 24 full pages
    assert len(want) == PAGES
    meta = generate(mooncake_stack.worker_urls[0], IDS)
    assert meta["cached_tokens"] == 0, meta

    events = stream.until(lambda ev: l3_hashes(ev) >= set(want))
    l3 = [e for e in stored(events, EXTERNAL) if e.block_hashes[0] in want]
    held = l3_pages(mooncake_stack, IDS[: PAGES * PAGE])
    # exactly the pages the master holds (all of them), each announced once
    assert held == [1] * PAGES
    assert [h for e in l3 for h in e.block_hashes] == want
    # the device events' hashes, parents and token ids: the chain starts at the root
    pages = chain(l3)
    assert pages == chain([e for e in stored(events, GPU) if e.block_hashes[0] in want])
    assert pages[0][1] is None
    assert [t for _, _, toks in pages for t in toks] == IDS[: PAGES * PAGE]
    assert {e.block_size for e in l3} == {PAGE} and {e.lora_id for e in l3} == {None}


def test_a_storage_clear_removes_what_the_worker_announced(
    mooncake_stack: Stack, stream: Stream
) -> None:
    """POST /hicache/storage-backend/clear empties the shared store (Mooncake remove_all): the
    worker lists every page it announced in L3 since it started (this prompt's among them).

    Mooncake's remove_all() without force (SGLang's call) skips objects under a lease, and any
    read or existence query (SGLang's prefetch, our l3_pages) leases an object for the master's
    default_kv_lease_ttl, 10 s: the clear waits that out, or the pages would survive it."""
    url = mooncake_stack.worker_urls[0]
    want = page_hashes(IDS, PAGE)
    announced = l3_hashes(stream.history())
    if not set(want) <= announced:  # run alone: store the prompt first
        generate(url, IDS)
        stream.until(lambda ev: l3_hashes(ev) >= set(want))
        announced = l3_hashes(stream.history())
    time.sleep(LEASE_S)
    req = urllib.request.Request(f"{url}/hicache/storage-backend/clear", b"", method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200

    def removed(events: list[Any]) -> list[BlockRemoved]:
        return [e for e in events if isinstance(e, BlockRemoved) and e.medium == EXTERNAL]

    (gone,) = removed(stream.until(lambda ev: bool(removed(ev))))
    assert set(gone.block_hashes) == announced and len(gone.block_hashes) == len(announced)
    assert l3_pages(mooncake_stack, IDS[: PAGES * PAGE]) == [0] * PAGES
