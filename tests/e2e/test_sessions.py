"""16 agent sessions x 5 turns through a launched stack, read from the decision headers."""

from __future__ import annotations

from smetric_router.loadgen.sessions import run_sessions
from tests.e2e.conftest import StackFactory


async def test_smetric_balances_first_turns_and_sticks_follow_ups(make_stack: StackFactory) -> None:
    stack = make_stack(policy="smetric")
    report = await run_sessions(stack.url, sessions=16, turns=5)
    assert len(report.records) == 80

    first = report.first_turn_workers()
    assert set(first) == set(stack.worker_urls), first
    assert max(first.values()) <= 2 * 16 / 4, first
    assert {r.reason for r in report.records if r.turn == 0} == {"first-turn-balance"}

    pairs = report.followups()
    sticky_same = [f for p, f in pairs if f.reason == "sticky" and f.worker == p.worker]
    assert len(sticky_same) >= 0.9 * len(pairs), report.summary()
    # The emulated worker's own cached_tokens cover the carried history on sticky follow-ups.
    assert all(f.cached_tokens >= f.history_tokens > 0 for f in sticky_same), [
        (f.cached_tokens, f.history_tokens) for f in sticky_same
    ]


async def test_load_balance_loses_stickiness(make_stack: StackFactory) -> None:
    stack = make_stack(policy="load_balance")
    report = await run_sessions(stack.url, sessions=16, turns=5)
    assert report.reasons() == {"load_balance": 80}
    assert report.stuck_share() <= 0.5, report.summary()


async def test_agent_wire_shape_sticks_and_finds_the_previous_prompt(
    make_stack: StackFactory,
) -> None:
    """Tool definitions, assistant tool_calls and tool results (what coding agents send): the
    follow-ups stick and the worker's cached_tokens reach the previous prompt's full pages."""
    stack = make_stack(policy="smetric")
    report = await run_sessions(stack.url, sessions=8, turns=4, tools=True)
    pairs = report.followups()
    assert len(pairs) == 24
    assert all(f.reason == "sticky" and f.worker == p.worker for p, f in pairs), report.summary()
    assert report.prompt_covered_share() == 1.0, [(p.prompt_tokens, f.cached_tokens)
                                                  for p, f in pairs]  # fmt: skip
