"""No comment, docstring or document points at the project's issue tracker by number ("issue N",
"issue #N", "(issue N, item M)", "item M"): a newcomer cannot follow such a reference, so the text
says what the behaviour is and why instead. Links to other projects' pull requests, which a reader
can open, are not references of this kind."""

from __future__ import annotations

import re
from pathlib import Path

from tests.docs.markdown import README, REPO, rel, repo_files

FOLDERS = ("docs", "smetric_router", "tests", "benchmarks", "launch", "sglang_env", "deploy")
ROOTS = [README, REPO / "Makefile", REPO / "pyproject.toml", REPO / "Dockerfile",
         REPO / ".dockerignore", *(REPO / f for f in FOLDERS)]  # fmt: skip
SUFFIXES = (".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".sh", ".jinja", "Makefile",
            "Dockerfile")  # fmt: skip
ISSUE_REFERENCE = re.compile(r"\bissues?[ #-]{0,2}\d+|\bitems? \d+", re.IGNORECASE)


def scanned() -> list[Path]:
    files: list[Path] = []
    for root in ROOTS:
        if root.is_file():
            files.append(root)
        elif root.is_dir():
            files.extend(repo_files(root, SUFFIXES))
    return files


def test_the_scan_reaches_code_tests_and_docs() -> None:
    names = {rel(p) for p in scanned()}
    assert {"README.md", "smetric_router/router/cli.py", "tests/docs/test_no_issue_numbers.py",
            "benchmarks/results/README.md", "Makefile", "Dockerfile",
            "deploy/docker/sglang-worker.Dockerfile", "deploy/base/router/deployment.yaml",
            "docs/deploy.md"} <= names  # fmt: skip


def test_no_issue_numbers() -> None:
    found = [
        f"{rel(path)}:{number}: {line.strip()[:120]}"
        for path in scanned()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1)
        if ISSUE_REFERENCE.search(line)
    ]
    assert not found, "\n".join(found)
