"""Launched stacks: emulated workers + router as real processes, started by the launcher."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from smetric_router.launch import ClusterSpec, RouterSpec, Stack, WorkerSpec

# Fast emulated time keeps the tests quick; fast load polling lets the overload test see a flood.
SPEEDUP = 20.0
ROUTER_ARGS = ("--load-poll-interval-secs", "0.1", "--log-level", "warning")

StackFactory = Callable[..., Stack]


@pytest.fixture(scope="module")
def make_stack() -> Iterator[StackFactory]:
    stacks: list[Stack] = []

    def make(policy: str = "smetric", workers: int = 4, speedup: float = SPEEDUP,
             worker_args: tuple[str, ...] = ()) -> Stack:  # fmt: skip
        spec = ClusterSpec(
            router=RouterSpec(port=0, policy=policy, extra_args=ROUTER_ARGS),
            workers=WorkerSpec(count=workers, speedup=speedup, extra_args=worker_args),
        )
        stack = Stack(spec)
        stacks.append(stack)
        stack.start()
        return stack

    yield make
    for s in stacks:
        s.stop()
