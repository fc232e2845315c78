"""Hooks for the whole suite."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.groups import keep_groups_together, put_real_sglang_first, worker_unit


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep_groups_together(items)
    put_real_sglang_first(items)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist: each process takes whole units (tests/helpers/groups.py), in the
    order collected. Its own --dist loadgroup would do it from marks, but it renames tests
    through an attribute pytest 9.2 no longer reads."""
    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no types
        def _split_scope(self, nodeid: str) -> str:
            return worker_unit(nodeid)

    return ByUnit(config, log)
