"""The patch folder: one ``sglang-<version>-<name>.patch`` per change, each split per file."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from smetric_router.patches.patch_tool import SectionState, State, state_of
from smetric_router.patches.unified_diff import FileSection, split_sections

_NAME = re.compile(r"^sglang-(\d+(?:\.\d+)+)-[\w.-]+\.patch$")


def default_patch_dir() -> Path:
    """``patches/`` at the repository root (this file is smetric_router/patches/patchset.py)."""
    return Path(__file__).resolve().parents[2] / "patches"


class PatchSetError(ValueError):
    """The patch folder is missing, empty, or holds a file we cannot apply file by file."""


@dataclass(frozen=True)
class PatchFile:
    path: Path
    version: str  # the SGLang release the patch was made against, from its file name
    sections: tuple[FileSection, ...]

    @property
    def name(self) -> str:
        return self.path.name


def load_patch_dir(patch_dir: Path) -> list[PatchFile]:
    """Every ``*.patch`` in the folder, by name. Two may touch the same file only in separate
    places: no line of the unpatched file may lie in a hunk (context included) of both. Each
    patch's section of that file then applies, and reads as applied or not, whether or not the
    other's is applied (``patch`` finds the unchanged context at its new offset)."""
    if not patch_dir.is_dir():
        raise PatchSetError(f"patch folder not found: {patch_dir}")
    patches: list[PatchFile] = []
    seen: dict[str, list[tuple[str, FileSection]]] = {}
    for path in sorted(patch_dir.glob("*.patch")):
        m = _NAME.match(path.name)
        if m is None:
            raise PatchSetError(f"{path.name}: expected a name like sglang-<version>-<what>.patch")
        try:
            sections = tuple(split_sections(path.read_text()))
        except ValueError as exc:
            raise PatchSetError(f"{path.name}: {exc}") from exc
        for s in sections:
            for other, o in seen.get(s.path, []):
                if s.overlaps(o):
                    raise PatchSetError(
                        f"{s.path}: {other} and {path.name} change overlapping lines"
                    )
            seen.setdefault(s.path, []).append((path.name, s))
        patches.append(PatchFile(path=path, version=m[1], sections=sections))
    if not patches:
        raise PatchSetError(f"no *.patch files in {patch_dir}")
    return patches


@dataclass(frozen=True)
class PatchReport:
    patch: PatchFile
    files: tuple[SectionState, ...]

    def count(self, state: State) -> int:
        return sum(f.state is state for f in self.files)

    @property
    def summary(self) -> str:
        """applied / not applied / partially applied / conflict."""
        if self.count(State.CONFLICT):
            return State.CONFLICT.value
        applied = self.count(State.APPLIED)
        if applied == len(self.files):
            return State.APPLIED.value
        return State.NOT_APPLIED.value if applied == 0 else "partially applied"

    def pending(self, state: State) -> list[FileSection]:
        return [f.section for f in self.files if f.state is state]


def inspect(program: str, site_dir: Path, patches: Sequence[PatchFile]) -> list[PatchReport]:
    return [
        PatchReport(p, tuple(state_of(program, site_dir, s) for s in p.sections)) for p in patches
    ]
