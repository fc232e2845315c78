"""The router's KV-event decoder, index and feed against recorded real SGLang 0.5.23 traffic.

tests/fixtures/kv_events holds every ZMQ message one real SGLang CPU worker sent while it was
driven through inserts, device evictions, a host hit, host evictions and /flush_cache, plus what
the worker itself said after each phase: its per-tier probe, its host-pool gauge, the
cached_tokens of each request. Here the index built from those bytes must say the same.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable, Collection, Iterable
from typing import Any

import msgspec
import pytest

from smetric_router.cluster.kv_index import KvIndex
from smetric_router.cluster.subscriber import FeedConfig, KvEventFeed
from smetric_router.core.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
)
from tests.cluster.recorded_worker import RecordedWorker
from tests.fixtures.kv_events import Message, Phase, load
from tests.fixtures.kv_events.truths import Truths
from tests.helpers.polling import eventually

CONFIG = FeedConfig(replay_timeout_s=0.5, retry_max_s=0.2)
REC = load()
PAGE = REC.page_size
PROMPTS = REC.prompts
T = Truths(REC)
matches, check_phase = T.matches, T.check_phase


# --- the recording itself -------------------------------------------------------------------


def test_recording_is_what_the_readme_says() -> None:
    assert REC.metadata["sglang_version"] == "0.5.23"
    assert Counter((m.socket, m.replay) for m in REC.messages) == {
        ("replay", 0): 3, ("sub", None): 30, ("replay", 1): 33,
    }  # fmt: skip
    assert [m.seq for m in REC.sub] == list(range(2, 32))
    assert [ph.name for ph in REC.phases] == [
        "insert", "device_evict", "host_hit", "host_evict", "flush",
    ]  # fmt: skip


def _schemaless(payload: bytes) -> Any:
    return msgspec.msgpack.decode(payload)


def _as_wire(batch: KVEventBatch) -> list[Any]:
    """The typed batch back in the plain shape a schemaless msgpack reader sees."""
    out: list[dict[str, Any]] = []
    for ev in batch.events:
        if isinstance(ev, BlockStored):
            d: dict[str, Any] = {"type": "BlockStored", "block_hashes": ev.block_hashes,
                                 "parent_block_hash": ev.parent_block_hash,
                                 "token_ids": ev.token_ids, "block_size": ev.block_size,
                                 "lora_id": ev.lora_id}  # fmt: skip
        elif isinstance(ev, BlockRemoved):
            d = {"type": "BlockRemoved", "block_hashes": ev.block_hashes}
        else:
            assert isinstance(ev, AllBlocksCleared)
            d = {"type": "AllBlocksCleared"}
        if not isinstance(ev, AllBlocksCleared) and ev.medium is not None:
            d["medium"] = ev.medium
        out.append(d)
    return [batch.ts, out, batch.attn_dp_rank]


def test_every_recorded_payload_decodes_losslessly() -> None:
    """The typed decoder keeps every field SGLang sent (a schemaless reader sees nothing more)."""
    payloads = [m.payload for m in REC.messages if m.seq >= 0]
    assert len(payloads) == 2 + 30 + 32
    for p in payloads:
        assert _as_wire(decode_batch(p)) == _schemaless(p)


def test_recorded_block_hashes_are_the_routers_page_hashes() -> None:
    """Every hash SGLang published is the router's page hash of a driven prompt's prefix, and
    its token ids are that page's tokens."""
    by_hash = {
        h: toks[i * PAGE : (i + 1) * PAGE]
        for name, toks in PROMPTS.items()
        for i, h in enumerate(T.hashes[name])
    }
    seen = 0
    for m in REC.replay(1)[:-1]:
        for ev in decode_batch(m.payload).events:
            if isinstance(ev, BlockStored):
                assert ev.block_size == PAGE and ev.lora_id is None
                for i, h in enumerate(ev.block_hashes):
                    assert by_hash[h] == ev.token_ids[i * PAGE : (i + 1) * PAGE]
                    seen += 1
            elif isinstance(ev, BlockRemoved):
                assert all(h in by_hash for h in ev.block_hashes)
    assert seen == 2 + 26 * 2 + 64 * 2 + 8 + 80 * 2


def _event_counts(messages: Iterable[Message]) -> dict[str, tuple[int, int]]:
    """(type/medium) -> (events, pages)."""
    events: Counter[str] = Counter()
    pages: Counter[str] = Counter()
    for m in messages:
        for ev in decode_batch(m.payload).events:
            medium = getattr(ev, "medium", None)
            key = type(ev).__name__ + ("" if medium is None else f"/{medium}")
            events[key] += 1
            pages[key] += len(getattr(ev, "block_hashes", ()))
    return {k: (events[k], pages[k]) for k in events}


def test_decoded_events_per_phase() -> None:
    """Types, media and counts per phase (the table in tests/fixtures/kv_events/README.md)."""
    s, g, h = "BlockStored", "GPU", "CPU_PINNED"
    expected = {
        "insert": {f"{s}/{g}": (5, 26), f"{s}/{h}": (5, 26)},
        "device_evict": {f"{s}/{g}": (4, 64), f"{s}/{h}": (4, 64), f"BlockRemoved/{g}": (2, 43)},
        "host_hit": {f"{s}/{g}": (1, 8)},
        "host_evict": {
            f"{s}/{g}": (5, 80),
            f"{s}/{h}": (5, 80),
            f"BlockRemoved/{g}": (5, 88),
            f"BlockRemoved/{h}": (3, 48),
        },
        "flush": {"AllBlocksCleared": (1, 0)},
    }
    start = 0
    for phase in REC.phases:
        assert _event_counts(REC.sub[start : phase.sub_through]) == expected[phase.name]
        start = phase.sub_through
    # before the recorder joined: SGLang's start-up flush, then its warm-up request's page
    assert _event_counts(REC.replay(0)[:-1]) == {
        "AllBlocksCleared": (1, 0), f"{s}/{g}": (1, 1), f"{s}/{h}": (1, 1),
    }  # fmt: skip


# --- the index against the worker's own answers --------------------------------------------


def test_index_equals_the_workers_probe_and_gauge_after_each_phase() -> None:
    pages = T.check_phases()  # (phase, GPU pages, host pages)
    assert pages == [("insert", 27, 27), ("device_evict", 48, 91), ("host_hit", 56, 91),
                     ("host_evict", 48, 123), ("flush", 0, 0)]  # fmt: skip


def test_index_predicts_sglang_cached_tokens_for_every_request() -> None:
    assert T.check_cached_tokens() == 15


def test_replay_answers_decode_and_equal_the_live_stream() -> None:
    live = {m.seq: m for m in REC.sub}
    first, last = REC.replay(0), REC.replay(1)
    assert [m.seq for m in first] == [0, 1, -1]
    assert [m.seq for m in last] == [*range(32), -1]
    for answer in (first, last):
        # the end marker, as SGLang 0.5.23 sends it: [b"", b"", seq -1, b""]
        assert answer[-1].frames == (b"", b"", b"\xff" * 8, b"")
        for m in answer[:-1]:
            assert m.frames[0] == b"" and m.topic == b""
            decode_batch(m.payload)
            if m.seq in live:
                assert (m.topic, m.frames[-2], m.payload) == live[m.seq].frames
    assert [m.payload for m in first[:-1]] == [m.payload for m in last[:2]]


# --- the feed over sockets that send the recorded bytes -------------------------------------


def at_seq(feed: KvEventFeed, seq: int) -> Callable[[], bool]:
    """Whether the feed has applied batch `seq` (an `eventually` condition bound to this seq)."""
    return lambda: feed.last_seq == seq


@pytest.fixture
async def worker() -> AsyncIterator[RecordedWorker]:
    w = await RecordedWorker(REC).start()
    yield w
    await w.close()


async def joined(w: RecordedWorker, index: KvIndex) -> KvEventFeed:
    """A feed that joined after SGLang's start-up batches (seq 0, 1) and warmed up by replay."""
    w.published_before_anyone_joined(1)
    feed = KvEventFeed(w.url, index, config=CONFIG)
    feed.start()
    await w.subscribed()
    await eventually(lambda: feed.last_seq == 1, "warm start from the replay socket")
    # the second round finds nothing after seq 1: the end of the buffer is confirmed
    await eventually(lambda: w.replay_starts == [0, 2], "warm start confirmed")
    return feed


async def play(
    w: RecordedWorker,
    feed: KvEventFeed,
    lost: Collection[int] = (),
    after_phase: Callable[[Phase], None] = lambda _: None,
    after_seq: dict[int, Callable[[], None]] | None = None,
) -> None:
    """Send the recorded live stream; once the feed has applied a phase's last batch (or a seq
    in after_seq), check."""
    start = 0
    for phase in REC.phases:
        for m in REC.sub[start : phase.sub_through]:
            await w.send(m, lost=m.seq in lost)
            if after_seq and m.seq in after_seq:
                await eventually(at_seq(feed, m.seq), f"seq {m.seq}")
                after_seq[m.seq]()
        start = phase.sub_through
        if phase.last_seq in lost:  # nothing after it tells the feed it missed something
            continue
        await eventually(at_seq(feed, phase.last_seq), f"after {phase.name}")
        after_phase(phase)


async def test_feed_follows_the_recorded_stream(worker: RecordedWorker) -> None:
    index = KvIndex()
    feed = await joined(worker, index)
    try:
        await play(worker, feed, after_phase=lambda ph: check_phase(index, worker.url, ph))
        s = feed.state()
        assert (s.batches_applied, s.gaps_recovered, s.resets, s.decode_errors) == (32, 0, 0, 0)
        assert s.block_size == PAGE and s.events_enabled
    finally:
        await feed.stop()


async def test_feed_fills_gaps_from_the_recorded_replay(worker: RecordedWorker) -> None:
    index = KvIndex()
    feed = await joined(worker, index)
    try:
        # lost on the way: single batches and a run, GPU and host stores, removals
        await play(worker, feed, lost={4, 13, 14, 18, 27},
                   after_phase=lambda ph: check_phase(index, worker.url, ph))  # fmt: skip
        # a replay answers up to what was published by then, which may fill a later gap too
        starts = worker.replay_starts[2:]  # after the warm start's
        assert starts[:2] == [4, 13] and set(starts[2:]) <= {18, 27}, starts
        assert (feed.gaps_recovered, feed.resets, feed.batches_applied) == (len(starts), 0, 32)
    finally:
        await feed.stop()


async def test_unfillable_gap_clears_and_never_over_reports(worker: RecordedWorker) -> None:
    """Seq 13 (a device-eviction batch) is lost and the replay buffer no longer has it: the
    worker's view starts over; afterwards the index may under-report, never over-report."""
    worker.unreplayable.add(13)
    index = KvIndex()
    feed = await joined(worker, index)

    def at_most_the_truth(phase: Phase) -> None:
        got = matches(index, worker.url, phase.probe)
        if phase.last_seq < 13:
            assert got == phase.probe
            return
        for name, (device, host) in phase.probe.items():
            assert got[name][0] <= device and got[name][1] <= host, (phase.name, name)

    try:
        await play(worker, feed, lost={13}, after_phase=at_most_the_truth)
        assert (feed.gaps_recovered, feed.resets) == (0, 1)
        assert index.stats(worker.url).gpu_pages == 0  # AllBlocksCleared at the end
    finally:
        await feed.stop()


# --- a payload the decoder cannot read ------------------------------------------------------

FOREIGN = {
    "garbage": b"\xc1 not msgpack at all",
    # valid msgpack, another layout: an event map without SGLang's "type" tag
    "untagged-events": msgspec.msgpack.encode(
        [1.0, [{"kind": "stored", "hashes": [1, 2], "parent": None}], 0]
    ),
    # SGLang's envelope with an event type 0.5.23 does not have
    "unknown-event-type": msgspec.msgpack.encode(
        [1.0, [{"type": "BlockPinned", "block_hashes": [1]}], 0]
    ),
    # a map where SGLang sends an array
    "map-batch": msgspec.msgpack.encode({"ts": 1.0, "events": [], "dp_rank": 0}),
}


@pytest.mark.parametrize("kind", sorted(FOREIGN))
async def test_undecodable_payload_resets_counts_and_logs_once(
    worker: RecordedWorker, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Seq 12 (the first device-eviction batch) arrives in a foreign schema: the view built so
    far is cleared, the error is counted and logged once, and the feed goes on without ever
    over-reporting."""
    worker.payloads[12] = FOREIGN[kind]
    index = KvIndex()
    feed = await joined(worker, index)
    insert = REC.phases[0]

    def after(phase: Phase) -> None:
        if phase.name == "insert":
            check_phase(index, worker.url, phase)
            assert index.stats(worker.url).gpu_pages == 27
            return
        got = matches(index, worker.url, phase.probe)
        for name, (device, host) in phase.probe.items():
            assert got[name][0] <= device and got[name][1] <= host, (phase.name, name)

    def cleared() -> None:
        assert (index.stats(worker.url).gpu_pages, index.stats(worker.url).host_pages) == (0, 0)
        assert matches(index, worker.url, PROMPTS) == dict.fromkeys(PROMPTS, (0, 0))
        assert (feed.decode_errors, feed.resets) == (1, 1)

    caplog.set_level(logging.WARNING, logger="smetric_router.cluster.subscriber")
    try:
        await play(worker, feed, after_phase=after, after_seq={12: cleared})
        assert insert.last_seq == 11
        s = feed.state()
        assert (s.decode_errors, s.resets, s.gaps_recovered, s.batches_applied) == (1, 1, 0, 31)
        lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(lines) == 1
        msg = lines[0].getMessage()
        assert worker.url in msg and "batch 12 " in msg and "schema" in msg
    finally:
        await feed.stop()


async def test_only_the_first_of_consecutive_undecodable_batches_warns(
    worker: RecordedWorker, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker speaking another schema fails every batch: each one is counted and clears, one
    warning is logged until a batch decodes again."""
    for seq in (12, 13, 14):
        worker.payloads[seq] = FOREIGN["unknown-event-type"]
    worker.payloads[20] = FOREIGN["garbage"]
    index = KvIndex()
    feed = await joined(worker, index)
    caplog.set_level(logging.WARNING, logger="smetric_router.cluster.subscriber")
    try:
        await play(worker, feed)
        assert (feed.decode_errors, feed.resets) == (4, 4)
        warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warned) == 2 and "batch 12 " in warned[0] and "batch 20 " in warned[1]
    finally:
        await feed.stop()
