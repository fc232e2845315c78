"""The README and the docs/ pages stay true to the repository: the README stays a short front
door, every relative link leads somewhere, every repository path a page names exists, and the
commands a reader copies name real modules, make targets and flags.

A command is checked when it runs one of the project's entry points (``smetric-router``,
``python -m smetric_router...``, ``python -m benchmarks...``, ``make TARGET``, and the launcher
behind ``make run ARGS=...``): its flags must appear in that command's own ``--help``. SGLang's
commands (``python -m sglang...``) are checked the same way in the CPU SGLang environment, and
skipped without it. Python blocks must compile; YAML, JSON and TOML blocks must parse.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest
import tomllib
import yaml

from tests.docs.markdown import (
    README,
    REPO,
    Block,
    anchors,
    code_blocks,
    inline_code,
    make_targets,
    markdown_files,
    pages,
    rel,
    relative_links,
    repo_path,
    shell_commands,
)
from tests.sglang_env import run_sglang

README_MAX_LINES = 250
PROJECT_PACKAGES = frozenset({"smetric_router", "benchmarks"})
# The console script `smetric-router` (pyproject's [project.scripts]) run from this checkout, not
# from wherever the virtualenv's copy of the package was installed from.
ROUTER_SCRIPT = (
    "-c",
    "import sys; from smetric_router.router.cli import main; "
    "sys.argv[0] = 'smetric-router'; main()",
)
# What the bench harness gives SGLang on a machine without GPUs (benchmarks/compare.py bench_env).
SGLANG_ENV = {
    "PYTHONPATH": os.pathsep.join([str(REPO / "smetric_router/sglang_cpu/site"), str(REPO)]),
    "SMETRIC_SGLANG_CPU": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
MAKE_TARGETS = make_targets(REPO / "Makefile")
_FLAG = re.compile(r"(?<![\w-])--[A-Za-z0-9][\w-]*")
_SUBCOMMANDS = re.compile(r"^positional arguments:\n\s+\{([^}]+)\}", re.M)

Env = Literal["main", "sglang"]


@dataclass(frozen=True)
class Invocation:
    """One command of a page that runs a Python entry point."""

    where: str
    env: Env  # main: this test's interpreter (.venv); sglang: the CPU SGLang environment
    program: tuple[str, ...]  # what follows the interpreter, before the page's own arguments
    args: tuple[str, ...]


@dataclass(frozen=True)
class MakeCall:
    where: str
    targets: tuple[str, ...]
    variables: tuple[tuple[str, str], ...]


def interpret(where: str, words: list[str]) -> Invocation | MakeCall | None:
    """What a command runs, if it is one the pages' tests check; None for anything else (curl,
    export, the coding agents' CLIs)."""
    while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
        words = words[1:]  # FOO=1 cmd ...: the environment of one command
    if not words:
        return None
    program, rest = words[0], words[1:]
    if program == "make":
        assigned = [w for w in rest if "=" in w]
        targets = [w for w in rest if "=" not in w and not w.startswith("-")]
        return MakeCall(
            where, tuple(targets), tuple((k, v) for k, _, v in (w.partition("=") for w in assigned))
        )
    if program == "smetric-router":
        return Invocation(where, "main", ROUTER_SCRIPT, tuple(rest))
    if Path(program).name in ("python", "python3") and rest[:1] == ["-m"] and len(rest) > 1:
        module, args = rest[1], tuple(rest[2:])
        top = module.split(".")[0]
        if top in PROJECT_PACKAGES:
            env: Env = "sglang" if ".venv-sglang" in program else "main"
            return Invocation(where, env, ("-m", module), args)
        if top == "sglang":
            return Invocation(where, "sglang", ("-m", module), args)
    return None


def shell_blocks() -> list[Block]:
    return [b for page in pages() for b in code_blocks(page) if b.lang in ("bash", "sh", "shell")]


def all_calls() -> list[Invocation | MakeCall]:
    calls: list[Invocation | MakeCall] = []
    for block in shell_blocks():
        for offset, words in shell_commands(block.text):
            call = interpret(f"{rel(block.page)}:{block.line + 1 + offset}", words)
            if call is not None:
                calls.append(call)
    return calls


def launched_by(target: str) -> tuple[str, ...] | None:
    """The module a make target runs with $(ARGS) (`run`: the launcher), as `-m MODULE`."""
    for line in MAKE_TARGETS.get(target, []):
        m = re.search(r"-m\s+(\S+)\s+\$\(ARGS\)", line)
        if m:
            return ("-m", m.group(1))
    return None


def invocations() -> list[Invocation]:
    """The pages' entry-point commands, those behind `make ... ARGS=...` included."""
    out: list[Invocation] = []
    for call in all_calls():
        if isinstance(call, Invocation):
            out.append(call)
            continue
        variables = dict(call.variables)
        for target in call.targets:
            program = launched_by(target)
            if program is not None and "ARGS" in variables:
                args = tuple(shell_commands(variables["ARGS"])[0][1])
                out.append(Invocation(call.where, "main", program, args))
    return out


# --help output, per environment and program: every command of one program shares one run.
_HELP: dict[tuple[Env, tuple[str, ...]], subprocess.CompletedProcess[str]] = {}
_PREFETCHED: set[Env] = set()


def _run_help(env: Env, program: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    if env == "sglang":
        return run_sglang([*program, "--help"], env=SGLANG_ENV, timeout=300)
    return subprocess.run(
        [sys.executable, *program, "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def prefetch(env: Env) -> None:
    """Run every --help the pages need in `env` at once, so they overlap."""
    wanted = sorted({i.program for i in INVOCATIONS if i.env == env})
    with ThreadPoolExecutor(max_workers=8) as pool:
        done = pool.map(lambda program: _run_help(env, program), wanted)
        _HELP.update(((env, program), proc) for program, proc in zip(wanted, done, strict=True))


def help_text(env: Env, program: tuple[str, ...]) -> str:
    if env not in _PREFETCHED:
        prefetch(env)
        _PREFETCHED.add(env)
    if (env, program) not in _HELP:  # a subcommand's
        _HELP[(env, program)] = _run_help(env, program)
    proc = _HELP[(env, program)]
    output = (proc.stdout + proc.stderr)[-2000:]
    assert proc.returncode == 0, f"{' '.join(program)} --help exited {proc.returncode}: {output}"
    return proc.stdout


INVOCATIONS = invocations()
BLOCKS = [b for page in pages() for b in code_blocks(page)]


def _param(i: Invocation) -> object:
    marks = [pytest.mark.sglang] if i.env == "sglang" else []
    name = "smetric-router" if i.program == ROUTER_SCRIPT else i.program[-1]
    label = " ".join([name, *i.args])[:60]
    return pytest.param(i, id=f"{i.where} {label}", marks=marks)


def test_readme_is_a_front_door() -> None:
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move sections to docs/"
    )


@pytest.mark.parametrize("page", markdown_files(), ids=rel)
def test_relative_links_resolve(page: Path) -> None:
    """In every Markdown file of the repository, not only the pages: results and notes link to
    each other's headings, and a renamed heading breaks them silently."""
    broken = []
    for target in relative_links(page):
        path_part, _, fragment = target.partition("#")
        path = (page.parent / path_part).resolve() if path_part else page
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif fragment and path.suffix == ".md" and fragment not in anchors(path):
            broken.append(f"{target}: no heading with that anchor in {rel(path)}")
    assert not broken, broken


@pytest.mark.parametrize("page", pages(), ids=rel)
def test_named_repository_paths_exist(page: Path) -> None:
    names = {p for p in map(repo_path, inline_code(page)) if p is not None}
    missing = sorted(p for p in names if not (REPO / p).exists())
    assert not missing, missing


@pytest.mark.parametrize(
    "call", [c for c in all_calls() if isinstance(c, MakeCall)], ids=lambda c: c.where
)
def test_make_targets_exist(call: MakeCall) -> None:
    unknown = [t for t in call.targets if t not in MAKE_TARGETS]
    assert not unknown, f"{call.where}: make {unknown} is not a Makefile target"


@pytest.mark.parametrize("inv", [_param(i) for i in INVOCATIONS])
def test_command_flags_are_in_its_help(inv: Invocation) -> None:
    text = help_text(inv.env, inv.program)
    m = _SUBCOMMANDS.search(text)
    positional = [a for a in inv.args if not a.startswith("-")]
    if m and positional and positional[0] in m.group(1).split(","):
        text += help_text(inv.env, (*inv.program, positional[0]))
    known = set(_FLAG.findall(text))
    flags = [a.partition("=")[0] for a in inv.args if a.startswith("--")]
    unknown = [f for f in flags if f not in known]
    assert not unknown, f"{inv.where}: {' '.join(inv.program)} has no {unknown}"
    paths = {p for a in inv.args if (p := repo_path(a.partition("=")[2] or a)) is not None}
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert not missing, f"{inv.where}: {missing} do not exist"


@pytest.mark.parametrize(
    "block",
    [b for b in BLOCKS if b.lang in ("python", "py", "yaml", "yml", "json", "toml")],
    ids=lambda b: f"{b.where} {b.lang}",
)
def test_code_block_parses(block: Block) -> None:
    if block.lang in ("python", "py"):
        compile(block.text, block.where, "exec")
    elif block.lang in ("yaml", "yml"):
        yaml.safe_load(block.text)
    elif block.lang == "json":
        json.loads(block.text)
    else:
        tomllib.loads(block.text)


def test_pages_have_commands_to_check() -> None:
    """The parsing above found what the pages hold: a silent parser would pass every test."""
    modules = {i.program[-1] for i in INVOCATIONS}
    assert {"smetric_router.launch", "benchmarks.compare", "smetric_router.sim"} <= modules
    assert any(i.program == ROUTER_SCRIPT for i in INVOCATIONS)
    targets = {t for c in all_calls() if isinstance(c, MakeCall) for t in c.targets}
    assert {"run", "test", "sglang"} <= targets
