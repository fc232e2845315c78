"""Reading the repository's Markdown for the docs tests: fenced code blocks, relative links, heading
anchors as GitHub makes them, inline code that names a repository path, and the shell commands in a
``bash`` block split the way a shell splits them (quotes, line continuations, comments, ``&&``);
and walking the repository's own files, past virtualenvs and installed packages."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"

_FENCE = re.compile(r"^\s*```\s*([\w+-]*)")
# Inline code may wrap onto the next line, as a long path or command in a paragraph does.
_INLINE_CODE = re.compile(r"`[^`]+`")
_LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
# What a shell separates commands with, as shlex's punctuation_chars mode hands them back.
_SEPARATORS = frozenset({"&&", "||", ";", "|", "&", "(", ")", ";;"})
# Placeholders and patterns in prose (`compare[-quick|-TAG].md`, `<host>`) name no single path.
_NOT_A_PATH = re.compile(r"[\s\[\]{}<>|*$…]|\.\.\.")
_BUILT_FOLDERS = frozenset({"node_modules", "__pycache__"})


def pages() -> list[Path]:
    """The README and every page under docs/."""
    return [README, *sorted(DOCS.glob("*.md"))]


def repo_files(root: Path, suffixes: tuple[str, ...]) -> Iterator[Path]:
    """Files under `root` with one of `suffixes`, in the repository's own folders: not hidden ones
    (.git, .venv, .venv-sglang, tool caches) nor what `make` installs (node_modules)."""
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(
            d for d in subfolders if not d.startswith(".") and d not in _BUILT_FOLDERS
        )
        for name in sorted(files):
            if name.endswith(suffixes):
                yield Path(folder) / name


def markdown_files() -> list[Path]:
    return list(repo_files(REPO, (".md",)))


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{rel(self.page)}:{self.line}"


def split_blocks(text: str) -> tuple[list[tuple[int, str, str]], str]:
    """(line, language, body) of each fenced block, and the text with the blocks blanked out
    (line count kept, so prose positions stay where they were)."""
    blocks: list[tuple[int, str, str]] = []
    prose: list[str] = []
    opened: tuple[int, str] | None = None
    body: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        fence = _FENCE.match(line)
        if opened is None and fence:
            opened, body = (number, fence.group(1).lower()), []
            prose.append("")
        elif opened is not None and line.strip() == "```":
            blocks.append((opened[0], opened[1], "\n".join(body) + "\n"))
            opened = None
            prose.append("")
        elif opened is not None:
            body.append(line)
            prose.append("")
        else:
            prose.append(line)
    assert opened is None, f"code block opened at line {opened[0]} is never closed"
    return blocks, "\n".join(prose)


def code_blocks(page: Path) -> list[Block]:
    blocks, _ = split_blocks(page.read_text())
    return [Block(page, line, lang, body) for line, lang, body in blocks]


def prose(page: Path) -> str:
    """The page without its fenced code blocks."""
    return split_blocks(page.read_text())[1]


def relative_links(page: Path) -> list[str]:
    """Link targets in the prose that are not URLs (a path, a path#anchor, or #anchor)."""
    text = _INLINE_CODE.sub("", prose(page))
    return [t for t in _LINK.findall(text) if not _SCHEME.match(t)]


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a Markdown file; repeated headings get -1, -2 as on GitHub."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in prose(page).splitlines():
        m = _HEADING.match(line)
        if not m:
            continue
        base = anchor(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def inline_code(page: Path) -> list[str]:
    return [span.strip("`").strip() for span in _INLINE_CODE.findall(prose(page))]


def repo_path(text: str) -> str | None:
    """`text` as a repository-relative path when it reads as one: a/b under a top-level folder or
    file of the repository (not a virtualenv or installed node modules, which `make` builds)."""
    text = text.rstrip("/")
    if "/" not in text or _NOT_A_PATH.search(text) or "node_modules" in text:
        return None
    top = text.split("/", 1)[0]
    if top in ("", ".", "..") or top.startswith(".venv") or not (REPO / top).exists():
        return None
    return text


def shell_commands(script: str) -> list[tuple[int, list[str]]]:
    """Each simple command of a shell script, as (the 0-based line it starts on, its words):
    continuation lines joined, comments dropped, quotes removed, and split at ``&&``, ``;``,
    ``|``."""
    commands: list[tuple[int, list[str]]] = []
    # The command read so far: lines continued with a backslash, or a quoted string that spans
    # lines (a JSON body for curl -d).
    pending = ""
    start = 0
    lines = script.split("\n")
    for number, line in enumerate(lines):
        if number and lines[number - 1].endswith("\\"):
            pending = pending[:-1] + " " + line  # a continuation: the same command
        elif pending:
            pending = f"{pending}\n{line}"
        else:
            pending, start = line, number
        if line.endswith("\\"):
            continue
        try:
            tokens = _words(pending)
        except ValueError:  # no closing quotation yet
            continue
        pending = ""
        words: list[str] = []
        for token in tokens:
            if token in _SEPARATORS:
                if words:
                    commands.append((start, words))
                words = []
            else:
                words.append(token)
        if words:
            commands.append((start, words))
    assert not pending, f"unclosed quotation in: {pending!r}"
    return commands


def _words(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def make_targets(makefile: Path) -> dict[str, list[str]]:
    """Each explicit target of a Makefile with its recipe lines."""
    targets: dict[str, list[str]] = {}
    current: list[str] = []
    for line in makefile.read_text().splitlines():
        if line.startswith("\t"):
            for name in current:
                targets[name].append(line.strip())
            continue
        m = re.match(r"^([^\s:#=][^:=]*):(?!=)", line)
        current = []
        if m and not line.startswith("."):
            current = [t for t in m.group(1).split() if "$" not in t]
            for name in current:
                targets.setdefault(name, [])
    return targets
