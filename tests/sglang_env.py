"""The CPU SGLang environment (.venv-sglang, ``make sglang``) seen from tests that run in the main
.venv, where SGLang is not installed: find its interpreter and run code in it as a subprocess.

- ``SMETRIC_SGLANG_PYTHON``: that environment's python (default ``<repo>/.venv-sglang/bin/python``,
  the launcher's rule: ``smetric_router.launch.kinds.sglang.sglang_python``);
- ``SMETRIC_REQUIRE_SGLANG=1``: a missing environment fails the test instead of skipping it.

Tests that use it carry the ``sglang`` marker (``-m 'not sglang'`` deselects them).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from smetric_router.launch import SglangSpec
from smetric_router.launch.kinds.sglang import sglang_python as launcher_sglang_python

REPO = Path(__file__).resolve().parents[1]
ENV_PYTHON = "SMETRIC_SGLANG_PYTHON"
ENV_REQUIRE = "SMETRIC_REQUIRE_SGLANG"
RESULT_PREFIX = "RESULT "


def sglang_python_path() -> Path:
    """$SMETRIC_SGLANG_PYTHON, else <repo>/.venv-sglang/bin/python (whether or not it exists)."""
    return Path(launcher_sglang_python(SglangSpec()))


def sglang_python() -> Path | None:
    """The environment's interpreter, or None where it does not exist."""
    path = sglang_python_path()
    return path if path.is_file() and os.access(path, os.X_OK) else None


def require_sglang_python() -> Path:
    """The interpreter; skips the test without it (fails it under SMETRIC_REQUIRE_SGLANG=1)."""
    path = sglang_python()
    if path is None:
        reason = (
            f"CPU SGLang env not found at {sglang_python_path()} (make sglang, or set {ENV_PYTHON})"
        )
        if os.environ.get(ENV_REQUIRE) == "1":
            pytest.fail(f"{reason}; {ENV_REQUIRE}=1 makes this a failure")
        pytest.skip(reason)
    return path


def run_sglang(
    args: Sequence[str],
    *,
    env: Mapping[str, str | None] | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """``<sglang python> args...`` from the repo root, the repo on PYTHONPATH (smetric_router is
    importable even where it is not installed there). ``env`` adds variables; None removes one."""
    python = require_sglang_python()
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), full_env.get("PYTHONPATH", "")) if p
    )
    for name, value in (env or {}).items():
        if value is None:
            full_env.pop(name, None)
        else:
            full_env[name] = value
    return subprocess.run(
        [str(python), *args],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_sglang_script(
    script: Path, *args: str, env: Mapping[str, str | None] | None = None, timeout: float = 600
) -> Any:
    """Run a script that ends by printing ``RESULT <json>``; its JSON, or an AssertionError that
    shows the script's output."""
    return run_sglang_script_results(script, *args, env=env, timeout=timeout)[-1]


def run_sglang_script_results(
    script: Path, *args: str, env: Mapping[str, str | None] | None = None, timeout: float = 600
) -> list[Any]:
    """Run a script that prints one or more ``RESULT <json>`` lines; their JSON in order, or an
    AssertionError that shows the script's output."""
    proc = run_sglang([str(script), *args], env=env, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stdout + proc.stderr)[-4000:]
        raise AssertionError(f"{script.name} exited {proc.returncode} without a result:\n{tail}")
    return [json.loads(ln[len(RESULT_PREFIX) :]) for ln in lines]
