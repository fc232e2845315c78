"""The emulated worker's KV-event publisher: SGLang 0.5.23's ZMQ wire protocol.

Payloads come from the emulator's own encoder (emulator/kv_events.py), never from the router's
decoding schema; tests/emulator/test_kv_encoding_recorded.py checks frames and replay answers
byte for byte against a recording of real SGLang (tests/fixtures/kv_events). The router's
subscriber tests also use this publisher as their stand-in for a worker.

PUB frames: [topic, seq (8-byte big-endian), msgpack KVEventBatch]; seq starts at 0. The PUB
socket binds its endpoint, or with bind=False connects to it (SGLang's `--kv-events-config`
without `"bind": true` and a concrete host); the replay socket always binds.
Replay (ROUTER): request [identity, b"", start_seq]; reply one [identity, b"", topic, seq, payload]
per buffered batch with seq >= start_seq, then the end marker [identity, b"", b"", -1, b""].

ZMQ sockets are not thread-safe and encoding plus sending costs time, so, like SGLang, one
background thread owns both sockets; `publish` only appends to a queue and writes one byte to a
wake-up pipe, which keeps it non-blocking and callable from an asyncio loop or any thread.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import zmq

from smetric_router.core.kv_events import KVCacheEvent
from smetric_router.emulator.kv_events import encode_batch

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)


@dataclass(frozen=True, slots=True)
class _Item:
    seq: int
    ts: float
    events: list[KVCacheEvent]


class KvEventPublisher:
    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        buffer_steps: int = 10000,
        hwm: int = 100000,
        bind: bool = True,
    ) -> None:
        self._topic = topic.encode()
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        self.endpoint: str = endpoint
        if bind:
            self._pub.bind(endpoint)
            self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        else:  # SGLang's publisher without "bind" and a concrete host: the subscriber binds
            self._pub.connect(endpoint)
        self._replay: zmq.Socket[bytes] | None = None
        self.replay_endpoint: str | None = None
        if replay_endpoint is not None:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(replay_endpoint)
            self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        self._buffer: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=buffer_steps)
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._seq_lock = threading.Lock()
        self._next_seq = 0
        # seq -> also drop from the replay buffer (test hook simulating loss)
        self._drops: dict[int, bool] = {}
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="kv-event-publisher", daemon=True)
        self._thread.start()

    def publish(self, events: Sequence[KVCacheEvent], ts: float | None = None) -> int:
        """Queue one batch; returns the seq it will carry."""
        if self._closed:
            raise RuntimeError("publisher is closed")
        stamp = time.time() if ts is None else ts
        with self._seq_lock:
            seq = self._next_seq
            self._next_seq += 1
            self._queue.put(_Item(seq, stamp, list(events)))
        self._wake()
        return seq

    def drop_seq(self, seq: int, replayable: bool = True) -> None:
        """Test hook: do not send batch `seq` on PUB (a lost message). With replayable=False it is
        also left out of the replay buffer, so a subscriber cannot recover it."""
        with self._seq_lock:
            self._drops[seq] = not replayable

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def close(self) -> None:
        """Send what is queued, then stop the thread and close the sockets."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._wake()
        self._thread.join(timeout=5)
        os.close(self._wake_r)
        os.close(self._wake_w)
        self._ctx.term()

    def _wake(self) -> None:
        # A byte already pending in the pipe wakes the thread just as well.
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"\0")

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._wake_r, zmq.POLLIN)
        if self._replay is not None:
            poller.register(self._replay, zmq.POLLIN)
        try:
            running = True
            while running:
                ready = dict(poller.poll())
                if self._wake_r in ready:
                    os.read(self._wake_r, 4096)
                running = self._drain_queue()
                if self._replay is not None:
                    while self._replay.poll(0):
                        self._serve_replay(self._replay)
        except Exception:
            log.exception("KV-event publisher thread failed")
        finally:
            self._pub.close(linger=0)
            if self._replay is not None:
                self._replay.close(linger=0)

    def _drain_queue(self) -> bool:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return True
            if item is None:
                return False
            payload = encode_batch(item.events, item.ts)
            seq_bytes = item.seq.to_bytes(8, "big")
            with self._seq_lock:
                drop = self._drops.pop(item.seq, None)
            if drop is None:
                self._pub.send_multipart((self._topic, seq_bytes, payload))
            if drop is not True:
                self._buffer.append((item.seq, payload))

    def _serve_replay(self, sock: zmq.Socket[bytes]) -> None:
        frames = sock.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            log.warning("invalid KV-event replay request: %r", frames)
            return
        identity, _, start = frames
        start_seq = int.from_bytes(start, "big")
        for seq, payload in self._buffer:
            if seq >= start_seq:
                sock.send_multipart((identity, b"", self._topic, seq.to_bytes(8, "big"), payload))
        sock.send_multipart((identity, b"", b"", END_SEQ, b""))
