"""The tenants' token buckets on a hand-moved clock: a minute's burst, continuous refill,
Retry-After in whole seconds, all-or-nothing charges, debt for a request over a minute's worth,
refunds."""

from __future__ import annotations

import pytest

from smetric_router.admission.buckets import REQUESTS, TOKENS, Limits, RateLimiter, TokenBucket
from tests.helpers.clock import FakeClock


def test_a_bucket_starts_full_and_refills_continuously() -> None:
    clock = FakeClock()
    b = TokenBucket(60, clock)  # one a second
    assert b.level == 60
    b.take(60)
    assert b.wait(1) == pytest.approx(1.0)
    clock.advance(0.5)
    assert b.level == pytest.approx(0.5)
    assert b.wait(1) == pytest.approx(0.5)
    clock.advance(100)
    assert b.level == 60  # never past full


def test_a_request_over_a_minutes_worth_waits_for_a_full_bucket_and_leaves_debt() -> None:
    clock = FakeClock()
    b = TokenBucket(100, clock)
    b.take(10)
    assert b.wait(500) == pytest.approx(10 * 60 / 100)  # until full, not for ever
    clock.advance(6)
    assert b.wait(500) == 0
    b.take(500)
    assert b.level == pytest.approx(-400)
    assert b.wait(1) == pytest.approx(401 * 0.6)


def test_allowance_must_be_positive() -> None:
    with pytest.raises(ValueError):
        TokenBucket(0, FakeClock())


def test_the_limiter_refuses_with_whole_seconds_and_takes_nothing() -> None:
    clock = FakeClock()
    lim = RateLimiter([("a", Limits(requests_per_minute=2, tokens_per_minute=600))], clock)
    assert lim.charge("a", 250) is None
    assert lim.charge("a", 250) is None
    refused = lim.charge("a", 100)
    assert refused is not None
    assert (refused.limit, refused.per_minute, refused.retry_after) == (REQUESTS, 2, 30)
    clock.advance(29.5)
    refused = lim.charge("a", 100)
    assert refused is not None and refused.retry_after == 1  # rounded up, at least 1
    clock.advance(0.5)
    # the requests bucket has one again; the tokens one 100 + 300 refilled: 450 is 50 short
    refused = lim.charge("a", 450)
    assert refused is not None and refused.limit == TOKENS
    assert refused.retry_after == 5  # 50 tokens at 10 a second
    assert lim.charge("a", 400) is None  # the refusal took nothing from the requests bucket


def test_untouched_tenants_and_unlimited_ones_pass() -> None:
    clock = FakeClock()
    lim = RateLimiter([("a", Limits(requests_per_minute=1)), ("b", Limits())], clock)
    assert lim  # a has a limit
    assert lim.charge("a", 0) is None
    assert lim.charge("a", 0) is not None
    for _ in range(100):
        assert lim.charge("b", 10**6) is None
        assert lim.charge("other", 10**6) is None
    assert not RateLimiter([("b", Limits())], clock)


def test_a_refund_gives_the_charge_back_up_to_full() -> None:
    clock = FakeClock()
    lim = RateLimiter([("a", Limits(requests_per_minute=1, tokens_per_minute=100))], clock)
    assert lim.charge("a", 80) is None
    assert lim.charge("a", 10) is not None
    lim.refund("a", 80)
    assert lim.charge("a", 100) is None
    lim.refund("a", 100)
    lim.refund("a", 100)  # never past full
    assert lim.charge("a", 100) is None
    assert lim.charge("a", 1) is not None


def test_the_router_wide_limit_holds_one_seconds_worth_over_every_tenant() -> None:
    clock = FakeClock()
    lim = RateLimiter(
        [("a", Limits(requests_per_minute=100))], clock, router_tokens_per_second=1000
    )
    assert lim  # a limit even where no tenant has one
    assert lim.charge("a", 600) is None
    refused = lim.charge("anonymous", 600)  # another tenant, the same router-wide bucket
    assert refused is not None and refused.router_wide and refused.limit == TOKENS
    assert refused.per_minute == 60_000 and refused.retry_after == 1  # 200 tokens: 0.2 s
    clock.advance(0.2)
    assert lim.charge("anonymous", 600) is None
    lim.refund("anonymous", 600)
    assert lim.charge("b", 600) is None  # the refund went back to the router's bucket
    # a prompt over a second's worth passes on a full bucket and leaves it in debt
    clock.advance(10)
    assert lim.charge("b", 3000) is None
    refused = lim.charge("b", 1)
    assert refused is not None and refused.retry_after == 3
