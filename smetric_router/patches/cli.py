"""``python -m smetric_router.patches apply|check|revert``: the SGLang fork as a patch set."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from smetric_router.patches.patch_tool import PatchToolError, State, find_patch_program, run_patch
from smetric_router.patches.patchset import (
    PatchReport,
    PatchSetError,
    default_patch_dir,
    inspect,
    load_patch_dir,
)
from smetric_router.patches.target import Target, TargetError, find_installed, from_site_dir

EXIT_OK = 0
EXIT_NOT_APPLIED = 1
EXIT_USAGE = 2
EXIT_ENVIRONMENT = 3
EXIT_CONFLICT = 4
EXIT_PATCH_FAILED = 5

EPILOG = """\
commands:
  check   report every patch file, and every file it touches, as applied / not applied /
          conflict (a dry run of 'patch -p1' forward and in reverse, per file)
  apply   apply what is not applied yet; already applied files are left alone (idempotent)
  revert  reverse what is applied; files that are not applied are left alone (idempotent)

exit codes:
  0  check: everything is applied; apply/revert: done, or nothing to do
  1  check: something is not applied (and nothing conflicts)
  2  bad command line
  3  cannot start: SGLang not found, its version differs from the patches' (see --force),
     the 'patch' program is missing, or the patch folder is missing or malformed
  4  a file is in conflict (neither the patch nor its reverse applies cleanly, or the file is
     missing); apply and revert then change nothing
  5  'patch' failed on a file after a clean dry run (run 'check' to see the state)
"""


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--patch-dir",
        type=Path,
        default=default_patch_dir(),
        help="folder of sglang-<version>-<name>.patch files (default: %(default)s)",
    )
    common.add_argument(
        "--site-dir",
        type=Path,
        default=None,
        help="directory holding the sglang/ package to patch (default: the site-packages this "
        "interpreter imports sglang from, found without importing it)",
    )
    common.add_argument(
        "--force",
        action="store_true",
        help="go on when the installed SGLang version is not the one a patch was made for",
    )
    parser = argparse.ArgumentParser(
        prog="python -m smetric_router.patches",
        description="Apply, check or revert the repository's SGLang patches on the SGLang "
        "installed in this Python environment.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{apply,check,revert}")
    for name, text in (
        ("apply", "apply what is not applied yet"),
        ("check", "say what is and is not applied; exit 0 only if everything is"),
        ("revert", "reverse what is applied"),
    ):
        sub.add_parser(name, parents=[common], help=text, description=text)
    return parser


def _print_report(report: PatchReport) -> None:
    applied, n = report.count(State.APPLIED), len(report.files)
    print(f"{report.patch.name}: {report.summary} ({applied}/{n} files applied)")
    for f in report.files:
        detail = f"  ({f.detail})" if f.detail else ""
        print(f"  {f.state.value:<12} {f.section.path}{detail}")


def _check(reports: list[PatchReport]) -> int:
    for r in reports:
        _print_report(r)
    if any(r.count(State.CONFLICT) for r in reports):
        print("conflict: some files match neither the patched nor the unpatched text")
        return EXIT_CONFLICT
    if all(r.count(State.APPLIED) == len(r.files) for r in reports):
        print("all patches applied")
        return EXIT_OK
    print("not everything is applied (run: python -m smetric_router.patches apply)")
    return EXIT_NOT_APPLIED


def _change(program: str, target: Target, reports: list[PatchReport], *, reverse: bool) -> int:
    conflicts = [r for r in reports if r.count(State.CONFLICT)]
    if conflicts:
        for r in conflicts:
            _print_report(r)
        print("error: conflicts; nothing was changed", file=sys.stderr)
        return EXIT_CONFLICT
    todo_state = State.APPLIED if reverse else State.NOT_APPLIED
    verb, past, done = (
        ("revert", "reverted", "not applied") if reverse else ("apply", "applied", "applied")
    )
    for r in reversed(reports) if reverse else reports:
        todo = r.pending(todo_state)
        if not todo:
            print(f"{r.patch.name}: already {done} ({len(r.files)} files), nothing to do")
            continue
        for section in todo:
            ok, out = run_patch(program, target.site_dir, section, reverse=reverse, dry_run=False)
            if not ok:
                print(f"error: patch failed to {verb} {section.path}:\n{out}", file=sys.stderr)
                return EXIT_PATCH_FAILED
        left = len(r.files) - len(todo)
        also = f"; {left} were already {done}" if left else ""
        print(f"{r.patch.name}: {past} {len(todo)} of {len(r.files)} files{also}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        patches = load_patch_dir(args.patch_dir.resolve())
        target = find_installed() if args.site_dir is None else from_site_dir(args.site_dir)
        program = find_patch_program()
    except (PatchSetError, TargetError, PatchToolError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    print(f"sglang {target.version or '(version unknown)'} at {target.site_dir}")
    print(f"patches from {args.patch_dir.resolve()}")
    wrong = [p for p in patches if p.version != target.version]
    for p in wrong:
        have = target.version or "an unknown version"
        msg = f"{p.name} is for sglang {p.version}, but {have} is installed"
        if not args.force:
            print(f"error: {msg} (--force to go on anyway)", file=sys.stderr)
            return EXIT_ENVIRONMENT
        print(f"warning: {msg}; going on (--force)", file=sys.stderr)
    try:
        reports = inspect(program, target.site_dir, patches)
        if args.command == "check":
            return _check(reports)
        return _change(program, target, reports, reverse=args.command == "revert")
    except PatchToolError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ENVIRONMENT
