"""The gate's waiters on a hand-moved clock: slots handed on in the queue's order, refusals,
timeouts, and a cancelled waiter leaving no trace."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from smetric_router.admission.gate import RECHECK_S, AdmissionConfig, Gate, Shed, Ticket
from smetric_router.admission.metrics import AdmissionMetrics
from smetric_router.admission.room import WorkerRoom
from tests.helpers.clock import FakeClock
from tests.helpers.gate import make_gate, queued

A = "http://a:1"


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """The sample of the one tenant (anonymous) unless the labels name another."""
    return registry.get_sample_value(name, {"tenant": "anonymous", **labels}) or 0.0


async def test_slots_are_handed_on_follow_ups_first() -> None:
    gate, clock, registry = make_gate(cap=1)
    held = await gate.admit(None, follow_up=False)
    assert held.waited_s == 0.0
    new = asyncio.create_task(gate.admit(None, follow_up=False))
    await queued(gate, 1)
    clock.advance(0.5)
    follow = asyncio.create_task(gate.admit(A, follow_up=True))
    await queued(gate, 2)
    clock.advance(0.5)
    held.release()
    first = await follow
    assert not new.done() and gate.running == 1
    assert first.waited_s == pytest.approx(0.5) and first.order == held.order + 1
    first.release()
    second = await new
    assert second.order == first.order + 1 and second.waited_s == pytest.approx(1.0)
    second.release()
    second.release()  # idempotent
    assert gate.running == 0 and gate.queued == 0
    assert sample(registry, "smetric_admission_admitted_total", kind="follow_up", queued="yes") == 1
    assert sample(registry, "smetric_admission_queued") == 0
    await gate.close()


async def test_a_full_queue_sheds_at_once() -> None:
    gate, _, registry = make_gate(cap=1, size=1)
    held = await gate.admit(None, False)
    waiting = asyncio.create_task(gate.admit(None, False))
    await queued(gate, 1)
    with pytest.raises(Shed) as e:
        await gate.admit(None, False)
    assert e.value.reason == "queue_full"
    assert sample(registry, "smetric_admission_shed_total", reason="queue_full",
                  kind="first_turn") == 1  # fmt: skip
    held.release()
    (await waiting).release()
    await gate.close()


async def test_a_follow_up_displaces_a_waiting_first_turn_which_is_shed() -> None:
    gate, _, _ = make_gate(cap=1, size=1)
    held = await gate.admit(None, False)
    new = asyncio.create_task(gate.admit(None, False))
    await queued(gate, 1)
    follow = asyncio.create_task(gate.admit(A, True))
    with pytest.raises(Shed) as e:
        await new
    assert e.value.reason == "displaced"
    held.release()
    (await follow).release()
    assert gate.running == 0
    await gate.close()


async def test_a_wait_past_the_timeout_is_shed() -> None:
    gate, clock, registry = make_gate(cap=1, timeout=2.0)
    held = await gate.admit(None, False)
    waiting = asyncio.create_task(gate.admit(A, True))
    await queued(gate, 1)
    clock.advance(2.0)
    with pytest.raises(Shed) as e:
        await waiting
    assert e.value.reason == "timeout" and gate.queued == 0
    assert sample(registry, "smetric_admission_shed_total", reason="timeout", kind="follow_up") == 1
    held.release()
    assert gate.running == 0
    await gate.close()


async def test_a_first_turn_past_its_ceiling_does_not_spin_the_recheck() -> None:
    gate, clock, _ = make_gate(cap=1)  # ceiling 5 s
    held = await gate.admit(None, False)
    waiting = asyncio.create_task(gate.admit(None, False))
    await queued(gate, 1)
    assert gate.next_pause_s() == RECHECK_S
    clock.advance(4.99)
    assert gate.next_pause_s() == pytest.approx(0.01)  # wakes as it reaches the ceiling
    clock.advance(1.0)  # past it and still waiting: the usual cadence, not 0
    assert gate.next_pause_s() == RECHECK_S
    held.release()
    (await waiting).release()
    await gate.close()


async def test_a_cancelled_waiter_leaves_the_queue_and_takes_no_slot() -> None:
    gate, _, registry = make_gate(cap=1)
    held = await gate.admit(None, False)
    gone = asyncio.create_task(gate.admit(None, False))
    await queued(gate, 1)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert gate.queued == 0
    assert sample(registry, "smetric_admission_shed_total", reason="cancelled",
                  kind="first_turn") == 1  # fmt: skip
    held.release()
    assert gate.running == 0
    nxt: Ticket = await gate.admit(None, False)  # the slot is free
    nxt.release()
    await gate.close()


async def test_a_waiter_admitted_as_it_is_cancelled_hands_its_slot_on() -> None:
    gate, _, _ = make_gate(cap=1)
    held = await gate.admit(None, False)
    gone = asyncio.create_task(gate.admit(None, False))
    await queued(gate, 1)
    held.release()  # admits it; its task has not resumed yet
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert gate.running == 0 and gate.queued == 0
    await gate.close()


async def test_a_follow_up_waits_for_its_worker_to_drain() -> None:
    rooms = [WorkerRoom(A, True, 3.0)]
    gate, _, _ = make_gate(cap=None, rooms=rooms, max_queued=2)
    waiting = asyncio.create_task(gate.admit(A, True))
    await queued(gate, 1)
    rooms[0] = WorkerRoom(A, True, 1.0)  # the next load report: it drained
    (await waiting).release()
    await gate.close()


async def test_tenants_share_the_slots_by_weight_and_are_counted_apart() -> None:
    clock = FakeClock()
    registry = CollectorRegistry()
    config = AdmissionConfig(1, 20, 30.0, 5.0, 0)

    def metrics(g: Gate) -> AdmissionMetrics:
        return AdmissionMetrics(registry, ["a", "b"], g.queued_by_tenant, lambda: g.running)

    gate = Gate(config, lambda: [], metrics, clock, weights={"a": 1, "b": 3})
    held = await gate.admit(None, False, "a")
    waiting = []
    for i in range(4):
        for t in ("a", "b"):
            waiting.append((t, asyncio.create_task(gate.admit(None, False, t, priority=i))))
            await queued(gate, len(waiting))
    assert sample(registry, "smetric_admission_queued", tenant="b") == 4
    order = []
    ticket = held
    for _ in range(4):
        ticket.release()
        done, _ = await asyncio.wait([t for _, t in waiting], return_when=asyncio.FIRST_COMPLETED)
        (task,) = done
        order.append(next(name for name, t in waiting if t is task))
        waiting = [(n, t) for n, t in waiting if t is not task]
        ticket = task.result()
    assert sorted(order) == ["a", "b", "b", "b"], order
    ticket.release()
    for next_done in asyncio.as_completed([t for _, t in waiting]):  # each admitted in turn
        (await next_done).release()
    assert sample(registry, "smetric_admission_admitted_total", kind="first_turn",
                  queued="yes", tenant="b") == 4  # fmt: skip
    assert gate.running == 0
    await gate.close()


async def test_a_freed_slot_goes_to_the_tenant_holding_fewer() -> None:
    clock = FakeClock()
    registry = CollectorRegistry()
    config = AdmissionConfig(3, 20, 30.0, 5.0, 0)

    def metrics(g: Gate) -> AdmissionMetrics:
        return AdmissionMetrics(registry, ["swarm", "alpha"], g.queued_by_tenant,
                                lambda: g.running)  # fmt: skip

    gate = Gate(config, lambda: [], metrics, clock)
    swarm = [await gate.admit(None, False, "swarm") for _ in range(3)]
    earlier = asyncio.create_task(gate.admit(None, False, "swarm"))
    await queued(gate, 1)
    clock.advance(0.1)
    alpha = asyncio.create_task(gate.admit(None, False, "alpha"))
    await queued(gate, 2)
    swarm[0].release()  # swarm still holds 2, alpha none: alpha's later request goes first
    ticket = await alpha
    assert ticket.tenant == "alpha" and not earlier.done()
    ticket.release()
    (await earlier).release()
    for t in swarm[1:]:
        t.release()
    assert gate.running == 0
    await gate.close()
