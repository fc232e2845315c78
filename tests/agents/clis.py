"""The real coding-agent CLIs (agents/package.json pins them; `make agents` installs them), a
scratch repository with a bug to fix, and each agent's configuration as the README writes it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "agents" / "node_modules" / ".bin"
# Each agent run's wall-clock limit (the README's promise: a small task within 4 minutes)
RUN_LIMIT_S = 240.0
TASK = "The test in test_calc.py fails. Find the bug in calc.py and fix it."


def cli(name: str) -> Path:
    """The pinned CLI; skips without it, except where it must be there (make test, CI)."""
    path = BIN / name
    if path.exists():
        return path
    why = f"{path} missing: run `make agents` (npm install of agents/package.json)"
    if os.environ.get("SMETRIC_REQUIRE_AGENTS") or os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


def scratch_repo(root: Path) -> Path:
    """A git repository with a one-line bug and the test that shows it."""
    repo = root / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    )
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "."], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "calc"], cwd=repo, check=True)
    return repo


def base_env(home: Path) -> dict[str, str]:
    """A clean environment: the agents keep their state under a fresh HOME."""
    home.mkdir(exist_ok=True)
    keep = ("PATH", "LANG", "TERM", "TMPDIR", "SSL_CERT_FILE")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    return {**env, "HOME": str(home), "NO_COLOR": "1"}


def claude_env(home: Path, router: str, model: str) -> dict[str, str]:
    """README "Coding agents", Claude Code."""
    return {
        **base_env(home),
        "ANTHROPIC_BASE_URL": router,
        "ANTHROPIC_AUTH_TOKEN": "none",
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }


CODEX_CONFIG = """\
model = "{model}"
model_provider = "smetric"

[model_providers.smetric]
name = "smetric-router"
base_url = "{router}/v1"
env_key = "SMETRIC_API_KEY"
wire_api = "responses"
"""


def codex_env(home: Path, router: str, model: str) -> dict[str, str]:
    """README "Coding agents", Codex: its provider block in $CODEX_HOME/config.toml."""
    env = base_env(home)
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(CODEX_CONFIG.format(model=model, router=router))
    return {**env, "CODEX_HOME": str(codex_home), "SMETRIC_API_KEY": "none"}


def opencode_config(router: str, model: str) -> str:
    """README "Coding agents", OpenCode: opencode.json in the project."""
    return (
        '{\n  "$schema": "https://opencode.ai/config.json",\n'
        '  "provider": {\n    "smetric": {\n'
        '      "npm": "@ai-sdk/openai-compatible",\n      "name": "smetric-router",\n'
        f'      "options": {{"baseURL": "{router}/v1", "apiKey": "none"}},\n'
        f'      "models": {{"{model}": {{"name": "{model}"}}}}\n'
        "    }\n  },\n"
        f'  "model": "smetric/{model}"\n}}\n'
    )


def run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run an agent non-interactively under the time limit (a hang fails, with its output)."""
    try:
        return subprocess.run(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=RUN_LIMIT_S,
        )
    except subprocess.TimeoutExpired as e:
        raise AssertionError(
            f"{argv[0]} did not finish within {RUN_LIMIT_S:.0f} s\nstdout: {e.stdout!r}\n"
            f"stderr: {e.stderr!r}"
        ) from None
