"""Slots kept for a conversation's next turn: the pure structure on a hand-moved clock, and the
gate that hands a kept slot to the follow-up before its queue."""

from __future__ import annotations

import asyncio

import pytest

from smetric_router.admission.slots import KeptSlots
from tests.helpers.clock import FakeClock
from tests.helpers.gate import make_gate, queued

A = "http://a:1"
# a conversation's prompts as page hashes: the follow-up re-sends the first prompt's pages
FIRST = [11, 12, 13]
FOLLOW = [11, 12, 13, 14, 15]
OTHER = [21, 22]


def test_a_slot_is_claimed_by_a_prompt_holding_its_page() -> None:
    clock = FakeClock()
    kept = KeptSlots(2.0, clock)
    kept.keep(FIRST[-1])
    assert len(kept) == 1
    assert not kept.claim(OTHER)
    assert kept.claim(FOLLOW)
    assert len(kept) == 0 and not kept.claim(FOLLOW)  # one slot, one claim


def test_a_slot_nobody_claims_expires_after_its_grace() -> None:
    clock = FakeClock()
    kept = KeptSlots(2.0, clock)
    kept.keep(13)
    clock.advance(1.0)
    kept.keep(13)  # a second request that ended on the same prompt
    assert kept.next_expiry() == pytest.approx(clock() + 1.0)
    clock.advance(1.0)
    assert kept.expire() == 1 and len(kept) == 1
    assert kept.claim(FOLLOW)  # the younger one is still there
    clock.advance(5.0)
    assert kept.expire() == 0 and kept.next_expiry() is None


def test_claims_take_the_oldest_under_a_page() -> None:
    clock = FakeClock()
    kept = KeptSlots(2.0, clock)
    kept.keep(13)
    clock.advance(1.5)
    kept.keep(13)
    assert kept.claim(FOLLOW)
    clock.advance(1.0)  # the first would have expired now; the second has 1 s left
    assert kept.expire() == 0 and len(kept) == 1
    clock.advance(1.0)
    assert kept.expire() == 1


def test_a_grace_of_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="grace_s"):
        KeptSlots(0.0, FakeClock())


async def test_the_gate_hands_a_kept_slot_to_the_follow_up_before_its_queue() -> None:
    gate, _, registry = make_gate(cap=1, grace=2.0)
    first = await gate.admit(None, follow_up=False)
    new = asyncio.create_task(gate.admit(None, follow_up=False))
    await queued(gate, 1)
    first.release(keep=FIRST[-1])
    assert gate.running == 1 and not new.done()  # the slot waits for the conversation
    follow = await gate.admit(A, follow_up=True, pages=FOLLOW)
    assert follow.waited_s == 0.0 and gate.running == 1 and gate.queued == 1
    follow.release()  # not kept: the slot goes to the queue at once
    second = await new
    assert second.waited_s == 0.0 and gate.running == 1
    second.release()
    assert gate.running == 0
    got = {
        o: registry.get_sample_value("smetric_admission_session_slots_total", {"outcome": o}) or 0.0
        for o in ("kept", "claimed", "expired")
    }
    assert got == {"kept": 1.0, "claimed": 1.0, "expired": 0.0}
    await gate.close()


async def test_a_kept_slot_nobody_claims_goes_back_to_the_queue() -> None:
    gate, clock, registry = make_gate(cap=1, grace=2.0)
    first = await gate.admit(None, follow_up=False)
    first.release(keep=FIRST[-1])
    waiting = asyncio.create_task(gate.admit(None, follow_up=True, pages=OTHER))
    await queued(gate, 1)  # another conversation's follow-up does not take it
    clock.advance(2.0)
    admitted = await waiting  # the queue's recheck expires the slot
    assert admitted.waited_s == pytest.approx(2.0) and gate.running == 1
    admitted.release()
    assert (
        registry.get_sample_value("smetric_admission_session_slots_total", {"outcome": "expired"})
        == 1.0
    )
    await gate.close()


async def test_without_a_grace_a_released_slot_is_free_whatever_it_was_given() -> None:
    gate, _, _ = make_gate(cap=1)
    first = await gate.admit(None, follow_up=False)
    first.release(keep=FIRST[-1])
    assert gate.running == 0
    (await gate.admit(None, follow_up=False)).release()
    await gate.close()
