"""Fixtures for the SGLang patch tests; the CPU SGLang env helpers are in tests/sglang_env.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sglang_env import require_sglang_python, run_sglang

SCRIPTS = Path(__file__).parent / "sglang_scripts"


@pytest.fixture(scope="session")
def sglang_patched() -> Path:
    """The CPU SGLang env's python, with the repo's patches applied to it (apply is idempotent:
    an env that already has them is left as it is)."""
    python = require_sglang_python()
    proc = run_sglang(["-m", "smetric_router.patches", "apply"], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return python
