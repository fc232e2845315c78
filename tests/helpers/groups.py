"""The order the suite runs in: the users of a stack shared across modules
(tests/real_sglang/conftest.py) run one after another, so that stack starts once.

pytest runs modules in file order, which interleaves those users with modules that start stacks
of their own; a shared stack is stopped before such a module (one real stack at a time, ~6.5 GB
each), so interleaved users would start it again each time (~30 s of CPU per start).

Under pytest-xdist (`make test` runs two processes), a module is the unit a process takes, so
its module fixtures start once, and everything under tests/real_sglang and tests/patches is one
unit: one process runs its real stacks one at a time (two at once would need ~13 GB) while the
other runs the rest. tests/patches belongs there because it reverts and re-applies the patches
in the CPU SGLang env itself: a real worker started meanwhile in the other process imported
SGLang unpatched (a fresh-clone run lost five real-SGLang tests to it). That unit is the
longest, so it goes first.
"""

from __future__ import annotations

import pytest

SHARED_STACK_FIXTURES = ("sglang_stack", "mooncake_stack")
REAL_SGLANG = ("tests/real_sglang/", "tests/patches/")  # the tests that use the SGLang env


def group_of(item: pytest.Item) -> str:
    """The shared stack a test uses, else its module."""
    used = getattr(item, "fixturenames", ())
    shared = [name for name in SHARED_STACK_FIXTURES if name in used]
    return shared[0] if shared else item.nodeid.split("::", 1)[0]


def keep_groups_together(items: list[pytest.Item]) -> None:
    """Reorder in place: each group where its first test was, in the order pytest collected."""
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        first.setdefault(group_of(item), i)
    items.sort(key=lambda item: first[group_of(item)])  # stable: a group keeps its own order


def worker_unit(nodeid: str) -> str:
    """The unit one pytest-xdist process runs whole: all of tests/real_sglang (its shared
    stacks' users included) and tests/patches, else the test's module."""
    return "real-sglang" if nodeid.startswith(REAL_SGLANG) else nodeid.split("::", 1)[0]


def put_real_sglang_first(items: list[pytest.Item]) -> None:
    """Stable: the rest keep their order."""
    items.sort(key=lambda item: not item.nodeid.startswith(REAL_SGLANG))
