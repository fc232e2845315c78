"""Drives the engine model in real time: one asyncio task steps it, sleeps for each step's model
time (divided by the speed-up) and hands progress to the requests waiting on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from smetric_router.core.kv_events import KVCacheEvent
from smetric_router.engine.api import CachedTokens, EngineModel, EngineRequest, StepResult

log = logging.getLogger(__name__)

Publish = Callable[[list[KVCacheEvent]], None]


class DuplicateRid(ValueError):
    pass


class Arrivals(Protocol):
    """What a request does between arriving and entering the engine (a global tier asking its
    store about the prompt's pages), and the notice that the runner has forgotten it."""

    async def arrive(self, rid: str, input_ids: list[int], output_ids: Sequence[int]) -> None: ...

    def depart(self, rid: str) -> None: ...


class EngineFailed(RuntimeError):
    pass


@dataclass(slots=True)
class Tracked:
    """One request's progress, read by the HTTP handler that waits on `changed`."""

    rid: str
    input_ids: list[int]
    output_ids: Sequence[int]
    counted: bool  # health probes stay out of the counters, as in SGLang
    priority: int | None = None  # SGLang's request priority (read with priority scheduling)
    started: float = field(default_factory=time.monotonic)
    # wall-clock moments (meta_info's timing keys): arrival, admission, first token (or the
    # end of the prefill, when no output is asked for), end
    received_wall: float = field(default_factory=time.time)
    admitted_wall: float | None = None
    first_token_wall: float | None = None
    finished_wall: float | None = None
    n_out: int = 0
    cached: CachedTokens | None = None
    finished: bool = False
    abort_message: str | None = None
    error_status: int | None = None  # set with abort_message when the request failed as an error
    on_finish: Callable[[Tracked], None] | None = None  # PD prefill: hands its KV over
    # PD decode: waits for the KV, then enters the engine; with Arrivals: their arrive() first
    arrival: asyncio.Task[None] | None = None
    storage_backend: str | None = None  # the L3 backend's name in the cache report, if any
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def done(self) -> bool:
        return self.finished or self.abort_message is not None

    @property
    def cached_total(self) -> int:
        return 0 if self.cached is None else self.cached.total


@dataclass(slots=True)
class Counters:
    requests: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    cached_tokens: int = 0
    # /v1/loads' step accounting, in model time: a step that admitted no request and emitted
    # tokens is a decode step; any other step counts as prefill busy time
    prefill_busy_us: int = 0
    # SGLang's decode_moments: [steps, sum batch, sum step_us, sum batch^2, sum batch*us, sum gen]
    decode_moments: list[float] = field(default_factory=lambda: [0.0] * 6)

    def account(self, result: StepResult) -> None:
        us = int(result.duration * 1e6)
        if us <= 0:
            return
        if result.scheduled or not result.emitted:
            self.prefill_busy_us += us
            return
        b = float(len(result.emitted))
        g = float(sum(n for _, n in result.emitted))
        for i, x in enumerate((1.0, b, float(us), b * b, b * us, g)):
            self.decode_moments[i] += x


class EngineRunner:
    def __init__(
        self,
        engine: EngineModel,
        speedup: float,
        publish: Publish | None,
        arrivals: Arrivals | None = None,
        storage_backend: str | None = None,
    ) -> None:
        if speedup <= 0:
            raise ValueError("speedup must be positive")
        self.engine = engine
        self._speedup = speedup
        self._publish = publish
        self._arrivals = arrivals
        self._storage_backend = storage_backend
        self._tracked: dict[str, Tracked] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._step_waiter: asyncio.Future[None] | None = None
        self.failure: BaseException | None = None
        self.counters = Counters()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done() and self.failure is None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="emulator-engine-loop")

    async def stop(self) -> None:
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None

    def submit(
        self,
        rid: str,
        input_ids: list[int],
        output_ids: Sequence[int],
        *,
        counted: bool = True,
        on_finish: Callable[[Tracked], None] | None = None,
        priority: int | None = None,
    ) -> Tracked:
        t = self._track(rid, input_ids, output_ids, counted, priority)
        t.on_finish = on_finish
        if self._arrivals is None:
            self.engine.add_request(EngineRequest(rid, input_ids, output_ids, priority=priority))
            self._wake.set()
        else:
            t.arrival = asyncio.create_task(self._arrive(t, self._arrivals), name=f"arrive-{rid}")
        return t

    async def _arrive(self, t: Tracked, arrivals: Arrivals) -> None:
        try:
            await arrivals.arrive(t.rid, t.input_ids, t.output_ids)
        except Exception:  # the hook only informs the cache report: serve the request anyway
            log.exception("arrival hook failed for %s", t.rid)
        if self._tracked.get(t.rid) is not t or t.done:
            return
        if self.failure is not None:
            t.abort_message, t.error_status = f"engine failed: {self.failure}", 503
            t.changed.set()
            return
        self.engine.add_request(
            EngineRequest(t.rid, t.input_ids, t.output_ids, priority=t.priority)
        )
        self._wake.set()

    def submit_prefilled(
        self,
        rid: str,
        input_ids: list[int],
        output_ids: Sequence[int],
        kv: Callable[[], Awaitable[CachedTokens]],
        error_status: int,
        priority: int | None = None,
    ) -> Tracked:
        """PD decode: the request enters the engine once kv() (its prompt's KV, transferred)
        arrives, with the cache report it yields; if kv() raises, the request fails with
        error_status and the exception's message."""
        t = self._track(rid, input_ids, output_ids, True, priority)

        async def arrive() -> None:
            try:
                cached = await kv()
            except Exception as exc:
                if not t.done:
                    t.abort_message, t.error_status = str(exc), error_status
                    t.changed.set()
                return
            if self._tracked.get(rid) is not t or t.done:
                return
            if self.failure is not None:
                t.abort_message, t.error_status = f"engine failed: {self.failure}", 503
                t.changed.set()
                return
            t.cached = cached
            self.engine.add_prefilled_request(
                EngineRequest(rid, input_ids, output_ids, priority=priority)
            )
            self._wake.set()

        t.arrival = asyncio.create_task(arrive(), name=f"kv-arrival-{rid}")
        return t

    def _track(
        self,
        rid: str,
        input_ids: list[int],
        output_ids: Sequence[int],
        counted: bool,
        priority: int | None = None,
    ) -> Tracked:
        if self.failure is not None:
            raise EngineFailed(str(self.failure))
        if rid in self._tracked:
            raise DuplicateRid(f"request id {rid!r} is already in flight")
        t = Tracked(
            rid, input_ids, output_ids, counted, priority, storage_backend=self._storage_backend
        )
        self._tracked[rid] = t
        if counted:
            self.counters.requests += 1
            self.counters.prompt_tokens += len(input_ids)
        return t

    def abort(self, rid: str, message: str = "Abort requested") -> None:
        t = self._tracked.pop(rid, None)
        if t is None:
            return
        self._forget(rid)
        if t.arrival is not None:
            t.arrival.cancel()
        self.engine.abort(rid)
        if not t.done:
            t.abort_message = message
            t.changed.set()
        self._emit(self.engine.drain_events())

    def abort_all(self) -> None:
        for rid in list(self._tracked):
            self.abort(rid)

    def release(self, rid: str) -> None:
        """The handler is done with a request: abort it if the engine still holds it."""
        t = self._tracked.get(rid)
        if t is not None and not t.done:
            self.abort(rid, "client went away")
        elif self._tracked.pop(rid, None) is not None:
            self._forget(rid)

    def _forget(self, rid: str) -> None:
        if self._arrivals is not None:
            self._arrivals.depart(rid)

    async def flush(self, timeout: float) -> bool:
        """Flush the cache once the engine is idle, waiting up to `timeout` seconds for that."""
        deadline = time.monotonic() + timeout
        while True:
            if self.engine.flush():
                self._emit(self.engine.drain_events())
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.01)

    async def next_step(self) -> None:
        """Returns once the engine completes its next step."""
        if self._step_waiter is None:
            self._step_waiter = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._step_waiter)

    def _emit(self, events: list[KVCacheEvent]) -> None:
        if events and self._publish is not None:
            self._publish(events)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            target = loop.time()
            while True:
                if not self.engine.has_work():
                    self._wake.clear()
                    await self._wake.wait()
                    target = loop.time()
                    continue
                result = self.engine.step()
                # Sleep to the step's end in model time; lag (a busy event loop) is dropped, not
                # caught up, so a slow client never sees a burst of catch-up steps.
                target = max(target + result.duration / self._speedup, loop.time())
                await asyncio.sleep(target - loop.time())
                self.counters.account(result)
                self._deliver(result.scheduled, result.emitted, result.finished)
                self._emit(result.kv_events)
                if self._step_waiter is not None:
                    self._step_waiter.set_result(None)
                    self._step_waiter = None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("engine loop failed; failing every request in flight")
            self.failure = exc
            for t in self._tracked.values():
                if not t.done:
                    t.abort_message = f"engine failed: {exc}"
                    t.changed.set()

    def _deliver(
        self,
        scheduled: list[tuple[str, CachedTokens]],
        emitted: list[tuple[str, int]],
        finished: list[str],
    ) -> None:
        c = self.counters
        now = time.time()
        for rid, cached in scheduled:
            t = self._tracked.get(rid)
            if t is None:
                continue
            if t.admitted_wall is None:
                t.admitted_wall = now
            if t.cached is None:  # a PD decode already holds its prefill's report
                t.cached = cached
            if t.counted:
                c.cached_tokens += t.cached.total
            t.changed.set()
        for rid, n in emitted:
            t = self._tracked.get(rid)
            if t is None:
                continue
            t.n_out = min(t.n_out + n, len(t.output_ids))
            if t.first_token_wall is None:
                t.first_token_wall = now
            if t.counted:
                c.generation_tokens += n
            t.changed.set()
        for rid in finished:
            t = self._tracked.get(rid)
            if t is None:
                continue
            if t.n_out < len(t.output_ids):
                # the engine drops a request that cannot fit its KV pool even when empty
                t.abort_message = "request does not fit the KV cache"
            else:
                t.finished = True
                t.finished_wall = now
                if t.first_token_wall is None:  # no output asked for: its prefill just ended
                    t.first_token_wall = now
                if t.on_finish is not None:
                    t.on_finish(t)
            t.changed.set()
