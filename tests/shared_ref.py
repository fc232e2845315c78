"""The project's shared reference (``../shared`` beside the repository) seen from tests.

A test that compares against a file there calls ``require_shared``: without the file it skips on a
developer's machine, but fails with a clear message where the reference must be present — under
``SMETRIC_REQUIRE_SHARED=1`` (what ``make test`` sets) or in CI (``CI`` set, as CI runners do).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"
ENV_REQUIRE = "SMETRIC_REQUIRE_SHARED"


def shared_required() -> bool:
    """Whether a missing shared reference is a failure here rather than a skip."""
    ci = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
    return os.environ.get(ENV_REQUIRE) == "1" or ci


def require_shared(path: Path) -> Path:
    """`path` (under ../shared) if it exists; else skip, or fail where it is required."""
    if path.exists():
        return path
    reason = f"shared reference {path} is missing (../shared is checked out beside the repo)"
    if shared_required():
        pytest.fail(f"{reason}; with {ENV_REQUIRE}=1 or CI set that is a failure, not a skip")
    pytest.skip(reason)
