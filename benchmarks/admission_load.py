"""The admission benchmark's client: agent sessions of several tenants over the OpenAI API.

Its own aiohttp client, no driver in between: each tenant has its API key (`Authorization:
Bearer`), each session is an agent whose turns are streamed chat completions, a turn sent only
when the previous reply has ended, with that reply and a tool result appended. One tenant may
arrive as bursts of sub-agents: `burst` sessions at the same instant that share their parent's
task as a prefix.

A refusal (429, or a 503: what smg answers when a request timed out in its queue) is honoured
as a client should: wait `Retry-After` (1 s when absent, which is counted), then send the same
turn again, at most `max_retries` times; after that the session is abandoned. Any other failure
(another status, a reset, a stream cut before `[DONE]`) ends the session as failed: a lost
request.

Every attempt is one `Attempt`; every session one `SessionResult`. Times are wall seconds from
the run's start; the report turns them into model time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp

_VOCAB = ("read", "file", "src", "main", "test", "error", "line", "def", "class", "return",
          "import", "value", "config", "patch", "build", "diff", "merge", "cache")  # fmt: skip
SYSTEM = (
    "You are a coding agent. You read files, run tools and edit code until the task is done. "
) * 12
# a refusal without Retry-After: how long the client waits before trying again
NO_RETRY_AFTER_WAIT_S = 1.0
# answers that refuse a request before it ran, to be retried later: the 429 routers send, and
# the 503 some send when a request timed out in their queue
REFUSALS = (429, 503)


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    key: str
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class Shape:
    """What one session sends."""

    turns: int = 4
    task_words: int = 1000  # the first turn's own text (on top of the shared system prompt)
    tool_words: int = 200  # each follow-up's tool result
    max_tokens: int = 32
    max_retries: int = 2  # 429s a turn may get before its session is abandoned
    request_timeout_s: float = 600.0


@dataclass(frozen=True, slots=True)
class SessionPlan:
    tenant: str
    sid: int
    start_s: float
    parent: int | None = None  # sub-agents: the launch they belong to


@dataclass(frozen=True, slots=True)
class Attempt:
    tenant: str
    sid: int
    turn: int
    attempt: int
    outcome: str  # ok | shed | error | unfinished (cut by the run's end)
    status: int  # 0: no HTTP answer
    turn_start_s: float  # when the turn's first attempt was sent
    start_s: float
    end_s: float
    ttft_s: float | None = None  # this attempt's, from its own start
    retry_after_s: float | None = None  # 429 only: the header's value, None when absent
    shed_reason: str = ""  # 429 only: x-smetric-shed (smetric-router's)
    admission_wait_ms: float | None = None  # x-smetric-admission-wait-ms
    detail: str = ""


@dataclass
class SessionResult:
    tenant: str
    sid: int
    start_s: float
    end_s: float = 0.0
    state: str = "unfinished"  # completed | abandoned | failed | unfinished
    turns_done: int = 0
    subagent: bool = False


@dataclass
class Records:
    attempts: list[Attempt] = field(default_factory=list)
    sessions: list[SessionResult] = field(default_factory=list)


def plan_sessions(
    rates: Mapping[str, float], bursts: Mapping[str, int], window_s: float, seed: int
) -> list[SessionPlan]:
    """Poisson arrivals per tenant over [0, window_s): `rates` in sessions per second; a tenant
    with a burst size k > 1 arrives as launches at rate/k, each k sub-agent sessions at once."""
    rng = random.Random(seed)
    out: list[SessionPlan] = []
    sid = 0
    for tenant, rate in sorted(rates.items()):
        k = max(1, bursts.get(tenant, 1))
        if rate <= 0:
            continue
        t = rng.expovariate(rate / k)
        launch = 0
        while t < window_s:
            for _ in range(k):
                out.append(SessionPlan(tenant, sid, t, launch if k > 1 else None))
                sid += 1
            launch += 1
            t += rng.expovariate(rate / k)
    return sorted(out, key=lambda p: p.start_s)


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_VOCAB) for _ in range(n))


def first_messages(plan: SessionPlan, shape: Shape, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed * 1_000_003 + plan.sid)
    if plan.parent is None:
        task = f"{plan.tenant} task {plan.sid}: " + _words(rng, shape.task_words)
    else:  # sub-agents of one launch share the parent's context, then get their own part
        parent = random.Random(seed * 7_000_003 + plan.parent)
        task = (f"{plan.tenant} parent task {plan.parent}: " + _words(parent, shape.task_words)
                + f"\nSub-task {plan.sid}: " + _words(rng, shape.tool_words))  # fmt: skip
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]


class Run:
    """One run's client: sessions against one router, records in `records`."""

    def __init__(self, url: str, model: str, tenants: Sequence[Tenant], shape: Shape,
                 seed: int = 1) -> None:  # fmt: skip
        self.url = url.rstrip("/")
        self.model = model
        self.keys = {t.name: t.key for t in tenants}
        self.shape = shape
        self.seed = seed
        self.records = Records()
        self._t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._t0

    async def play(self, plans: Sequence[SessionPlan], stop_s: float) -> Records:
        """Start each session at its time; at stop_s cut whatever still runs (`unfinished`)."""
        self._t0 = time.monotonic()
        conn = aiohttp.TCPConnector(limit=0, force_close=False)
        timeout = aiohttp.ClientTimeout(total=self.shape.request_timeout_s)
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as http:
            tasks = [asyncio.create_task(self._delayed(http, p)) for p in plans]
            await self._until(tasks, stop_s)
        return self.records

    async def closed_loop(self, tenant: str, concurrency: int, stop_s: float) -> Records:
        """`concurrency` agents each running sessions back to back until stop_s: the cluster
        kept busy without a queue of its own, for calibration."""
        self._t0 = time.monotonic()
        ids = iter(range(10**9))

        async def agent(http: aiohttp.ClientSession) -> None:
            while self.now() < stop_s:
                await self.session(http, SessionPlan(tenant, next(ids), self.now()))

        conn = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=self.shape.request_timeout_s)
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as http:
            tasks = [asyncio.create_task(agent(http)) for _ in range(concurrency)]
            await self._until(tasks, stop_s)
        return self.records

    async def _until(self, tasks: list[asyncio.Task[None]], stop_s: float) -> None:
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, stop_s - self.now()))
        for t in pending:
            t.cancel()
        for t in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await t

    async def _delayed(self, http: aiohttp.ClientSession, plan: SessionPlan) -> None:
        await asyncio.sleep(max(0.0, plan.start_s - self.now()))
        await self.session(http, plan)

    async def session(self, http: aiohttp.ClientSession, plan: SessionPlan) -> None:
        res = SessionResult(plan.tenant, plan.sid, self.now(), subagent=plan.parent is not None)
        self.records.sessions.append(res)
        rng = random.Random(self.seed * 31 + plan.sid)
        messages = first_messages(plan, self.shape, self.seed)
        try:
            for turn in range(self.shape.turns):
                reply, last = await self._turn(http, plan, turn, messages)
                if reply is None:
                    res.state = "abandoned" if last == "shed" else "failed"
                    return
                res.turns_done += 1
                messages.append({"role": "assistant", "content": reply})
                tool = "Tool result:\n" + _words(rng, self.shape.tool_words)
                messages.append({"role": "user", "content": tool})
            res.state = "completed"
        finally:  # cancelled by the run's end: the state stays unfinished
            res.end_s = self.now()

    async def _turn(self, http: aiohttp.ClientSession, plan: SessionPlan, turn: int,
                    messages: list[dict[str, str]]) -> tuple[str | None, str]:  # fmt: skip
        """The reply's text (None when the session ends here) and the last attempt's outcome."""
        turn_start = self.now()
        for attempt in range(self.shape.max_retries + 1):
            a, text = await self._send(http, plan, turn, attempt, turn_start, messages)
            self.records.attempts.append(a)
            if a.outcome == "ok":
                return text, a.outcome
            if a.outcome != "shed" or attempt == self.shape.max_retries:
                return None, a.outcome
            wait = a.retry_after_s if a.retry_after_s is not None else NO_RETRY_AFTER_WAIT_S
            await asyncio.sleep(wait)
        return None, "shed"

    async def _send(self, http: aiohttp.ClientSession, plan: SessionPlan, turn: int,
                    attempt: int, turn_start: float,
                    messages: list[dict[str, str]]) -> tuple[Attempt, str]:  # fmt: skip
        body = {"model": self.model, "messages": messages, "max_tokens": self.shape.max_tokens,
                "stream": True, "ignore_eos": True}  # fmt: skip
        headers = {"Authorization": f"Bearer {self.keys[plan.tenant]}"}
        start = self.now()
        ttft: float | None = None
        status = 0
        parts: list[str] = []

        def done(
            outcome: str,
            retry_after_s: float | None = None,
            shed_reason: str = "",
            admission_wait_ms: float | None = None,
            detail: str = "",
        ) -> tuple[Attempt, str]:
            a = Attempt(plan.tenant, plan.sid, turn, attempt, outcome, status, turn_start, start,
                        self.now(), ttft, retry_after_s, shed_reason, admission_wait_ms,
                        detail)  # fmt: skip
            return a, "".join(parts)

        try:
            async with http.post(f"{self.url}/v1/chat/completions", json=body,
                                 headers=headers) as r:  # fmt: skip
                status = r.status
                if status in REFUSALS:
                    reason = r.headers.get("x-smetric-shed") or _error_code(await r.read())
                    return done("shed", retry_after_s=_retry_after(r.headers.get("Retry-After")),
                                shed_reason=reason)  # fmt: skip
                if status != 200:
                    raw = await r.read()
                    return done("error", detail=raw[:200].decode(errors="replace"))
                wait_ms = _float(r.headers.get("x-smetric-admission-wait-ms"))
                finished = False
                async for line in r.content:
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        finished = True
                        break
                    event = json.loads(data)
                    if "error" in event:
                        return done("error", admission_wait_ms=wait_ms,
                                    detail=str(event["error"])[:200])  # fmt: skip
                    for choice in event.get("choices") or ():
                        piece = (choice.get("delta") or {}).get("content") or ""
                        if piece and ttft is None:
                            ttft = self.now() - start
                        parts.append(piece)
                if not finished:
                    return done("error", admission_wait_ms=wait_ms, detail="stream cut")
                return done("ok", admission_wait_ms=wait_ms)
        except asyncio.CancelledError:
            self.records.attempts.append(done("unfinished")[0])
            raise
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            return done("error", detail=f"{type(e).__name__}: {e}"[:200])


def _error_code(raw: bytes) -> str:
    """The OpenAI-shaped error body's code (or type), for the record."""
    try:
        err = json.loads(raw).get("error") or {}
        return str(err.get("code") or err.get("type") or "")
    except (ValueError, AttributeError):
        return ""


def _float(v: str | None) -> float | None:
    try:
        return None if v is None else float(v)
    except ValueError:
        return None


def _retry_after(v: str | None) -> float | None:
    """Retry-After in seconds (the delta form; an HTTP date is not what routers send)."""
    f = _float(v)
    return None if f is None or f < 0 else f
