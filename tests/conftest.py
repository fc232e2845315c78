"""Hooks for the whole suite."""

from __future__ import annotations

import pytest

from tests.helpers.groups import keep_groups_together


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep_groups_together(items)
