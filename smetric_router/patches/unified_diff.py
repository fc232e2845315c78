"""Split a unified diff into one section per touched file, checking every hunk's line counts."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,(\d+))? @@")


class DiffError(ValueError):
    """The text is not a unified diff this tool can apply file by file."""


@dataclass(frozen=True)
class FileSection:
    """The part of a patch that touches one file; ``text`` is fed to ``patch -p1`` as is."""

    path: str  # relative to site-packages, from the ``+++ b/...`` header (``-p1``)
    text: str
    hunks: int
    # per hunk, the first and last line of the unpatched file it covers (context included)
    old_lines: tuple[tuple[int, int], ...] = ()

    def overlaps(self, other: FileSection) -> bool:
        """Whether a hunk of each covers a common line of the unpatched file."""
        return any(a <= d and c <= b for a, b in self.old_lines for c, d in other.old_lines)


def _header_path(line: str, marker: str, lineno: int) -> str:
    name = line[len(marker) :].split("\t", 1)[0].strip()
    parts = PurePosixPath(name).parts
    if len(parts) < 2 or parts[0] not in ("a", "b"):
        raise DiffError(f"line {lineno}: expected an a/ or b/ path: {line!r}")
    path = PurePosixPath(*parts[1:])
    if path.is_absolute() or ".." in path.parts:
        raise DiffError(f"line {lineno}: path escapes the target directory: {line!r}")
    return str(path)


def _hunk_end(lines: list[str], start: int) -> tuple[int, tuple[int, int]]:
    """Index just past the hunk whose ``@@`` header is at ``start``, and the lines of the
    unpatched file it covers."""
    m = _HUNK.match(lines[start])
    if m is None:
        raise DiffError(f"line {start + 1}: expected a hunk header: {lines[start]!r}")
    old_left = int(m[2] if m[2] is not None else 1)
    new_left = int(m[3] if m[3] is not None else 1)
    covered = (int(m[1]), int(m[1]) + old_left - 1)
    i = start + 1
    while old_left or new_left:
        if i >= len(lines):
            raise DiffError(f"line {start + 1}: hunk ends before its line counts are met")
        tag = lines[i][:1]
        if tag == "\\":  # "\ No newline at end of file"
            i += 1
            continue
        if tag not in (" ", "-", "+"):
            raise DiffError(f"line {i + 1}: bad hunk line {lines[i]!r}")
        old_left -= tag in (" ", "-")
        new_left -= tag in (" ", "+")
        if old_left < 0 or new_left < 0:
            raise DiffError(f"line {i + 1}: hunk longer than its header says")
        i += 1
    while i < len(lines) and lines[i].startswith("\\"):
        i += 1
    return i, covered


def split_sections(text: str) -> list[FileSection]:
    """One section per ``---``/``+++`` header pair, in file order; raises DiffError."""
    lines = text.splitlines(keepends=True)
    sections: list[FileSection] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("--- "):
            if not lines[i].strip() or not sections:
                i += 1  # blank line, or commentary before the first file (git format-patch)
                continue
            raise DiffError(f"line {i + 1}: expected a '--- a/' header: {lines[i]!r}")
        if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
            raise DiffError(f"line {i + 2}: expected a '+++ b/' header after line {i + 1}")
        old = _header_path(lines[i], "--- ", i + 1)
        new = _header_path(lines[i + 1], "+++ ", i + 2)
        if old != new:
            raise DiffError(f"line {i + 1}: renames are not supported ({old} -> {new})")
        start, i = i, i + 2
        covered: list[tuple[int, int]] = []
        while i < len(lines) and lines[i].startswith("@@"):
            i, span = _hunk_end(lines, i)
            covered.append(span)
        if not covered:
            raise DiffError(f"line {start + 1}: {new} has no hunk")
        text = "".join(lines[start:i])
        sections.append(FileSection(new, text, len(covered), tuple(covered)))
    if not sections:
        raise DiffError("no file sections")
    paths = [s.path for s in sections]
    dupes = sorted({p for p in paths if paths.count(p) > 1})
    if dupes:
        raise DiffError(f"files with more than one section: {', '.join(dupes)}")
    return sections
