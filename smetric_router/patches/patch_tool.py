"""Run GNU ``patch`` on one file section: dry runs forward and in reverse tell its state.

Every run uses ``--force`` (never guess that a patch is reversed, never ask) and ``--fuzz=0``
(the patches target one pinned SGLang release, so every context line must match exactly; a fuzzy
match could land a hunk in the wrong place, or report an applied patch as applicable again).
"""

from __future__ import annotations

import enum
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from smetric_router.patches.unified_diff import FileSection


class PatchToolError(RuntimeError):
    """The ``patch`` program is missing or could not be run."""


class State(enum.Enum):
    APPLIED = "applied"
    NOT_APPLIED = "not applied"
    CONFLICT = "conflict"


@dataclass(frozen=True)
class SectionState:
    section: FileSection
    state: State
    detail: str  # why a conflict (patch's own words), else ""


def find_patch_program() -> str:
    program = shutil.which("patch")
    if program is None:
        raise PatchToolError(
            "the 'patch' program is not installed (Debian/Ubuntu: apt-get install patch)"
        )
    return program


def run_patch(
    program: str, site_dir: Path, section: FileSection, *, reverse: bool, dry_run: bool
) -> tuple[bool, str]:
    """(clean, combined output) of ``patch -p1`` on one section inside ``site_dir``."""
    cmd = [program, "-p1", "--force", "--fuzz=0", "--no-backup-if-mismatch", "--reject-file=-"]
    cmd += ["--directory", str(site_dir)]
    if reverse:
        cmd.append("--reverse")
    if dry_run:
        cmd.append("--dry-run")
    env = {**os.environ, "LC_ALL": "C"}
    try:
        proc = subprocess.run(
            cmd, input=section.text, capture_output=True, text=True, env=env, check=False
        )
    except OSError as exc:
        raise PatchToolError(f"cannot run {program}: {exc}") from exc
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


def _why(output: str) -> str:
    lines = [ln for ln in output.splitlines() if not ln.startswith("checking file")]
    return "; ".join(lines[:3])


def state_of(program: str, site_dir: Path, section: FileSection) -> SectionState:
    """Applied when only the reverse applies, not applied when only the forward one does."""
    if not (site_dir / section.path).is_file():
        return SectionState(section, State.CONFLICT, "file missing")
    forward, fwd_out = run_patch(program, site_dir, section, reverse=False, dry_run=True)
    backward, rev_out = run_patch(program, site_dir, section, reverse=True, dry_run=True)
    if backward and not forward:
        return SectionState(section, State.APPLIED, "")
    if forward and not backward:
        return SectionState(section, State.NOT_APPLIED, "")
    if forward and backward:
        return SectionState(section, State.CONFLICT, "applies both forward and in reverse")
    return SectionState(
        section,
        State.CONFLICT,
        f"neither forward ({_why(fwd_out)}) nor in reverse ({_why(rev_out)})",
    )
