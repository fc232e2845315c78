"""Token buckets for the rate limits, as pure structures on an injected clock.

A tenant's bucket holds up to one minute's allowance and refills continuously at allowance / 60
per second, so a tenant may burst a whole minute's worth at once and then goes at its rate. The
router-wide bucket (--rate-limit-tokens-per-second) holds one second's worth: it shapes the
cluster's intake, where a minute's burst would be the overload it is there to stop. A
request is let through when the bucket holds what it costs, and takes that much. One that costs
more than a whole minute's allowance (a prompt longer than tokens_per_minute) is let through on
a full bucket and leaves it in debt: it is never refused for good, and the debt is paid back
before the next one.

Router replicas (--processes, or separate routers given --replica-sync-peers) charge each other's
buckets: each publishes what it let through per tenant (spent()), and each charges its peers'
increments to its own buckets (absorb()), so N replicas hold a tenant to its limits as one router
would, give or take what passes in the few milliseconds before a peer's report arrives.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

REQUESTS = "requests"
TOKENS = "tokens"


class TokenBucket:
    def __init__(
        self, per_minute: float, clock: Callable[[], float], burst_s: float = 60.0
    ) -> None:
        if not per_minute > 0:
            raise ValueError(f"a bucket's allowance must be > 0 per minute, got {per_minute}")
        self.rate = per_minute / 60.0  # per second
        self.capacity = self.rate * burst_s
        self._clock = clock
        self._level = self.capacity  # starts full
        self._at = clock()

    @property
    def level(self) -> float:
        now = self._clock()
        if now > self._at:
            self._level = min(self.capacity, self._level + (now - self._at) * self.rate)
            self._at = now
        return self._level

    def wait(self, amount: float) -> float:
        """Seconds until the bucket can let `amount` through (0: now)."""
        missing = min(amount, self.capacity) - self.level
        return 0.0 if missing <= 0 else missing / self.rate

    def take(self, amount: float) -> None:
        self._level = self.level - amount

    def give_back(self, amount: float) -> None:
        """Undo a take() whose request was not served after all (never past full)."""
        self._level = min(self.capacity, self.level + amount)


@dataclass(frozen=True, slots=True)
class Refused:
    """A request over a limit: which one (REQUESTS or TOKENS), its allowance per minute, the
    whole seconds until the bucket has room (>= 1, for Retry-After), and whether it was the
    router-wide limit rather than the tenant's."""

    limit: str
    per_minute: float
    retry_after: int
    router_wide: bool = False


@dataclass(frozen=True, slots=True)
class Limits:
    """One tenant's allowances per minute (None: not limited)."""

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None


class RateLimiter:
    """Each limited tenant's buckets, and the router-wide one on prompt tokens. charge() is all
    or nothing: a request refused by one bucket takes nothing from the others."""

    def __init__(
        self,
        limits: Iterable[tuple[str, Limits]],
        clock: Callable[[], float],
        router_tokens_per_second: float = 0.0,
    ) -> None:
        self._router = (
            TokenBucket(router_tokens_per_second * 60, clock, burst_s=1.0)
            if router_tokens_per_second > 0
            else None
        )
        self._buckets: dict[str, list[tuple[str, TokenBucket]]] = {}
        # what this router took, net of refunds, per tenant since it started: (requests,
        # tokens), for router replicas to charge each other's buckets (replicas/sync.py)
        self._spent: dict[str, tuple[float, float]] = {}
        for tenant, lim in limits:
            buckets = []
            if lim.requests_per_minute is not None:
                buckets.append((REQUESTS, TokenBucket(lim.requests_per_minute, clock)))
            if lim.tokens_per_minute is not None:
                buckets.append((TOKENS, TokenBucket(lim.tokens_per_minute, clock)))
            if buckets:
                self._buckets[tenant] = buckets

    def __bool__(self) -> bool:
        return bool(self._buckets) or self._router is not None

    def _of(self, tenant: str) -> list[tuple[str, TokenBucket]]:
        mine = self._buckets.get(tenant, [])
        return mine if self._router is None else [*mine, (TOKENS, self._router)]

    def charge(self, tenant: str, tokens: int) -> Refused | None:
        """Let a request of `tokens` prompt tokens through (None), taking from the tenant's
        buckets and the router's, or say why not (taking nothing)."""
        refused = self.check(tenant, tokens)
        if refused is None:
            self._spend(tenant, 1.0, float(tokens))
        return refused

    def check(self, tenant: str, tokens: int) -> Refused | None:
        """What charge() would answer now, taking nothing."""
        worst: tuple[float, str, TokenBucket] | None = None
        for limit, bucket in self._of(tenant):
            wait = bucket.wait(_cost(limit, 1.0, float(tokens)))
            if wait > 0 and (worst is None or wait > worst[0]):
                worst = (wait, limit, bucket)
        if worst is not None:
            wait, limit, bucket = worst
            per_minute = bucket.rate * 60
            retry = max(1, math.ceil(wait - 1e-9))
            return Refused(limit, per_minute, retry, router_wide=bucket is self._router)
        return None

    def refund(self, tenant: str, tokens: int) -> None:
        """Give back a charge whose request left unserved (the admission queue shed it)."""
        self._spend(tenant, -1.0, -float(tokens))

    def spent(self) -> dict[str, tuple[float, float]]:
        """(requests, tokens) this router let through per limited tenant since it started, net
        of refunds (the router-wide limit counts every tenant)."""
        return dict(self._spent)

    def absorb(self, tenant: str, requests: float, tokens: float) -> None:
        """Charge what another router replica let through for `tenant` to the same buckets
        here, without refusing anything (a bucket may go into debt, paid back before the next
        request passes); negative amounts are that replica's refunds. Not counted in spent():
        each replica publishes only its own."""
        _apply(self._of(tenant), requests, tokens)

    def _spend(self, tenant: str, requests: float, tokens: float) -> None:
        """This router's own charge (or, negative, refund), counted in spent()."""
        buckets = self._of(tenant)
        if buckets:
            _apply(buckets, requests, tokens)
            r, t = self._spent.get(tenant, (0.0, 0.0))
            self._spent[tenant] = (r + requests, t + tokens)


def _cost(limit: str, requests: float, tokens: float) -> float:
    """What a bucket of kind `limit` (REQUESTS or TOKENS) is charged."""
    return requests if limit == REQUESTS else tokens


def _apply(buckets: list[tuple[str, TokenBucket]], requests: float, tokens: float) -> None:
    """Take the amounts from the buckets, or give negative ones back (never past full)."""
    for limit, bucket in buckets:
        amount = _cost(limit, requests, tokens)
        if amount >= 0:
            bucket.take(amount)
        else:
            bucket.give_back(-amount)
