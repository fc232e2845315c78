"""Launched stacks: emulated workers + router as real processes, started by the launcher."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from smetric_router.launch import ClusterSpec, MooncakeSpec, RouterSpec, Stack, WorkerSpec
from smetric_router.launch.ports import free_ports
from tests.mooncake_keys import require_mooncake

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


def mooncake_stack(router: RouterSpec) -> Iterator[Stack]:
    """Two emulated workers writing through to a real Mooncake store (its master on free
    ports), behind `router`: the body of a module's stack fixture."""
    require_mooncake()
    rpc, http, metrics = free_ports(3)
    spec = ClusterSpec(
        router=router,
        workers=WorkerSpec(count=2, speedup=SPEEDUP, page_size=16),
        mooncake=MooncakeSpec(rpc_port=rpc, http_metadata_port=http, metrics_port=metrics,
                              global_segment_size=str(64 << 20)),
    )  # fmt: skip
    with Stack(spec) as s:
        yield s
