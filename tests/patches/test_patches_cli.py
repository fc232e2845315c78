"""`python -m smetric_router.patches apply|check|revert`: on a stand-in site-packages (no SGLang
needed), then on the CPU SGLang env (.venv-sglang, marker ``sglang``), which it leaves patched."""

from __future__ import annotations

import difflib
import importlib.util
import re
from pathlib import Path

import pytest

from smetric_router.patches import cli
from smetric_router.patches.patchset import PatchSetError, default_patch_dir, load_patch_dir
from smetric_router.patches.unified_diff import DiffError, split_sections
from tests.sglang_env import run_sglang

ORIG = {
    "sglang/srt/one.py": "".join(f"line {i}\n" for i in range(1, 21)),
    "sglang/srt/two.py": "alpha\nbeta\ngamma\ndelta\nepsilon\n",
}
NEW = {
    "sglang/srt/one.py": ORIG["sglang/srt/one.py"].replace("line 10\n", "line 10\nadded 10b\n"),
    "sglang/srt/two.py": ORIG["sglang/srt/two.py"].replace("gamma\n", "GAMMA\n"),
}
PATCH_NAME = "sglang-0.5.23-demo.patch"


def make_diff(old: dict[str, str], new: dict[str, str]) -> str:
    return "".join(
        "".join(
            difflib.unified_diff(
                old[path].splitlines(keepends=True),
                new[path].splitlines(keepends=True),
                f"a/{path}",
                f"b/{path}",
            )
        )
        for path in sorted(old)
    )


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A site-packages with an unpatched sglang 0.5.23 (two files) and its dist-info."""
    root = tmp_path / "site"
    for path, text in ORIG.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    (root / "sglang" / "__init__.py").write_text("")
    info = root / "sglang-0.5.23.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n")
    return root


@pytest.fixture
def patch_dir(tmp_path: Path) -> Path:
    d = tmp_path / "patches"
    d.mkdir()
    (d / PATCH_NAME).write_text(make_diff(ORIG, NEW))
    return d


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def states(output: str) -> dict[str, str]:
    """'  <state>  <path>' lines of a report -> {path: state}."""
    found = re.findall(r"^  (applied|not applied|conflict)\s+(\S+)", output, flags=re.M)
    return {path: state for state, path in found}


def test_split_sections_one_per_file() -> None:
    sections = split_sections(make_diff(ORIG, NEW))
    assert [(s.path, s.hunks) for s in sections] == [
        ("sglang/srt/one.py", 1),
        ("sglang/srt/two.py", 1),
    ]
    assert sections[1].text.startswith("--- a/sglang/srt/two.py\n+++ b/sglang/srt/two.py\n@@")


def test_split_sections_rejects_bad_diffs() -> None:
    text = make_diff(ORIG, NEW)
    with pytest.raises(DiffError, match="hunk"):
        split_sections(text.replace("@@ -1,5 +1,5 @@", "@@ -1,5 +1,7 @@"))
    with pytest.raises(DiffError, match="escapes"):
        split_sections(text.replace("a/sglang/srt/two.py", "a/../etc/two.py"))
    with pytest.raises(DiffError, match="no file sections"):
        split_sections("just words\n")


REPO_PATCHES = {  # file name -> files it touches
    "sglang-0.5.23-smetric-l3-events.patch": 2,
    "sglang-0.5.23-smetric-prefix-probe.patch": 7,
}
PROBE = "sglang-0.5.23-smetric-prefix-probe.patch"


def test_the_repo_patch_set_loads() -> None:
    patches = load_patch_dir(default_patch_dir())
    assert {p.name: len(p.sections) for p in patches} == REPO_PATCHES
    assert {p.version for p in patches} == {"0.5.23"}
    # both change unified_radix_cache.py, in separate places
    shared = [s for p in patches for s in p.sections if s.path.endswith("unified_radix_cache.py")]
    assert len(shared) == 2 and not shared[0].overlaps(shared[1])


# Two patches over one file: one adds after line 3, the other after line 17 (hunks 1-6, 15-20).
SECOND = "sglang-0.5.23-other.patch"
NEW_FIRST = ORIG["sglang/srt/one.py"].replace("line 3\n", "line 3\nadded 3b\n")
NEW_SECOND = ORIG["sglang/srt/one.py"].replace("line 17\n", "line 17\nadded 17b\n")


@pytest.fixture
def two_patch_dir(tmp_path: Path) -> Path:
    d = tmp_path / "two"
    d.mkdir()
    one = {"sglang/srt/one.py": ORIG["sglang/srt/one.py"]}
    (d / PATCH_NAME).write_text(make_diff(one, {"sglang/srt/one.py": NEW_FIRST}))
    (d / SECOND).write_text(make_diff(one, {"sglang/srt/one.py": NEW_SECOND}))
    return d


def test_two_patches_may_change_one_file_in_separate_places(
    site: Path, two_patch_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each applies, reads as applied and reverts whether or not the other is applied."""
    path = site / "sglang/srt/one.py"
    both = NEW_FIRST.replace("line 17\n", "line 17\nadded 17b\n")
    only_second = tmp_path / "only_second"
    only_second.mkdir()
    (only_second / SECOND).write_text((two_patch_dir / SECOND).read_text())

    code, out = run(capsys, "apply", "--site-dir", str(site), "--patch-dir", str(only_second))
    assert code == cli.EXIT_OK and path.read_text() == NEW_SECOND
    args = ("--site-dir", str(site), "--patch-dir", str(two_patch_dir))
    code, out = run(capsys, "check", *args)
    assert code == cli.EXIT_NOT_APPLIED
    assert f"{PATCH_NAME}: not applied (0/1 files applied)" in out
    assert f"{SECOND}: applied (1/1 files applied)" in out
    code, out = run(capsys, "apply", *args)
    assert code == cli.EXIT_OK and path.read_text() == both
    code, out = run(capsys, "check", *args)
    assert code == cli.EXIT_OK
    code, out = run(capsys, "revert", "--site-dir", str(site), "--patch-dir", str(only_second))
    assert code == cli.EXIT_OK and path.read_text() == NEW_FIRST
    code, out = run(capsys, "revert", *args)
    assert code == cli.EXIT_OK and path.read_text() == ORIG["sglang/srt/one.py"]


def test_two_patches_changing_the_same_lines_are_refused(tmp_path: Path) -> None:
    d = tmp_path / "clash"
    d.mkdir()
    one = {"sglang/srt/one.py": ORIG["sglang/srt/one.py"]}
    near = ORIG["sglang/srt/one.py"].replace("line 12\n", "line 12\nadded 12b\n")
    (d / PATCH_NAME).write_text(make_diff(ORIG, NEW))  # adds after line 10: hunk 8-13
    (d / SECOND).write_text(make_diff(one, {"sglang/srt/one.py": near}))  # hunk 10-15
    with pytest.raises(PatchSetError, match="change overlapping lines"):
        load_patch_dir(d)


def test_check_apply_revert_cycle(
    site: Path, patch_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ("--site-dir", str(site), "--patch-dir", str(patch_dir))
    code, out = run(capsys, "check", *args)
    assert code == cli.EXIT_NOT_APPLIED
    assert states(out) == {p: "not applied" for p in ORIG}
    assert f"{PATCH_NAME}: not applied (0/2 files applied)" in out

    code, out = run(capsys, "revert", *args)  # nothing applied: no-op
    assert code == cli.EXIT_OK and "already not applied (2 files), nothing to do" in out

    code, out = run(capsys, "apply", *args)
    assert code == cli.EXIT_OK and "applied 2 of 2 files" in out
    assert {p: (site / p).read_text() for p in NEW} == NEW
    assert not list(site.rglob("*.orig")) and not list(site.rglob("*.rej"))

    code, out = run(capsys, "apply", *args)  # idempotent
    assert code == cli.EXIT_OK and "already applied (2 files), nothing to do" in out
    assert {p: (site / p).read_text() for p in NEW} == NEW

    code, out = run(capsys, "check", *args)
    assert code == cli.EXIT_OK
    assert states(out) == {p: "applied" for p in ORIG}

    code, out = run(capsys, "revert", *args)
    assert code == cli.EXIT_OK and "reverted 2 of 2 files" in out
    assert {p: (site / p).read_text() for p in ORIG} == ORIG


def test_partial_state_is_reported_and_completed(
    site: Path, patch_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (site / "sglang/srt/two.py").write_text(NEW["sglang/srt/two.py"])
    args = ("--site-dir", str(site), "--patch-dir", str(patch_dir))
    code, out = run(capsys, "check", *args)
    assert code == cli.EXIT_NOT_APPLIED
    assert "partially applied (1/2 files applied)" in out
    assert states(out) == {"sglang/srt/one.py": "not applied", "sglang/srt/two.py": "applied"}
    code, out = run(capsys, "apply", *args)
    assert code == cli.EXIT_OK and "applied 1 of 2 files; 1 were already applied" in out
    assert {p: (site / p).read_text() for p in NEW} == NEW


def test_conflict_changes_nothing(
    site: Path, patch_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edited = ORIG["sglang/srt/one.py"].replace("line 11\n", "line eleven\n")
    (site / "sglang/srt/one.py").write_text(edited)
    args = ("--site-dir", str(site), "--patch-dir", str(patch_dir))
    code, out = run(capsys, "check", *args)
    assert code == cli.EXIT_CONFLICT
    assert states(out) == {"sglang/srt/one.py": "conflict", "sglang/srt/two.py": "not applied"}
    assert "FAILED" in out  # patch's own words on the failing hunk
    code, out = run(capsys, "apply", *args)
    assert code == cli.EXIT_CONFLICT and "nothing was changed" in out
    assert (site / "sglang/srt/one.py").read_text() == edited
    assert (site / "sglang/srt/two.py").read_text() == ORIG["sglang/srt/two.py"]


def test_missing_file_is_a_conflict(
    site: Path, patch_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (site / "sglang/srt/two.py").unlink()
    code, out = run(capsys, "check", "--site-dir", str(site), "--patch-dir", str(patch_dir))
    assert code == cli.EXIT_CONFLICT
    assert "conflict     sglang/srt/two.py  (file missing)" in out


def test_version_mismatch_is_refused_unless_forced(
    site: Path, patch_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (site / "sglang-0.5.23.dist-info/METADATA").write_text("Name: sglang\nVersion: 0.5.22\n")
    args = ("--site-dir", str(site), "--patch-dir", str(patch_dir))
    code, out = run(capsys, "apply", *args)
    assert code == cli.EXIT_ENVIRONMENT
    assert f"{PATCH_NAME} is for sglang 0.5.23, but 0.5.22 is installed" in out
    assert (site / "sglang/srt/two.py").read_text() == ORIG["sglang/srt/two.py"]
    code, out = run(capsys, "apply", "--force", *args)
    assert code == cli.EXIT_OK and "going on (--force)" in out


def test_environment_errors(
    site: Path, patch_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    code, out = run(capsys, "check", "--site-dir", str(tmp_path), "--patch-dir", str(patch_dir))
    assert code == cli.EXIT_ENVIRONMENT and "holds no sglang/ package" in out
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out = run(capsys, "check", "--site-dir", str(site), "--patch-dir", str(empty))
    assert code == cli.EXIT_ENVIRONMENT and "no *.patch files" in out
    monkeypatch.setenv("PATH", str(empty))
    code, out = run(capsys, "check", "--site-dir", str(site), "--patch-dir", str(patch_dir))
    assert code == cli.EXIT_ENVIRONMENT and "'patch' program is not installed" in out


def test_help_documents_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for code in range(6):
        assert re.search(rf"^  {code}  ", text, flags=re.M), code


def test_no_sglang_in_this_environment(capsys: pytest.CaptureFixture[str]) -> None:
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("this environment has sglang")
    code, out = run(capsys, "check")
    assert code == cli.EXIT_ENVIRONMENT
    assert "sglang is not installed in this Python environment" in out


# --- the real CPU SGLang env -----------------------------------------------------------------


@pytest.mark.sglang
def test_finds_sglang_without_importing_it(sglang_patched: Path) -> None:
    code = "import sys; from smetric_router.patches.target import find_installed as f; t = f(); "
    code += "print(t.version, t.site_dir.name, 'sglang' in sys.modules)"
    proc = run_sglang(["-c", code], timeout=60)
    assert proc.stdout.split() == ["0.5.23", "site-packages", "False"], proc.stdout + proc.stderr


def cli_in_sglang(*args: str) -> tuple[int, str]:
    proc = run_sglang(["-m", "smetric_router.patches", *args], timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.sglang
def test_cli_on_the_sglang_env(sglang_patched: Path) -> None:
    """check per file, apply idempotent, revert -> not applied, apply again; ends APPLIED."""
    files = {s.path for p in load_patch_dir(default_patch_dir()) for s in p.sections}
    try:
        code, out = cli_in_sglang("check")
        assert code == 0, out
        assert "sglang 0.5.23 at " in out
        assert states(out) == {p: "applied" for p in files}
        code, out = cli_in_sglang("apply")
        assert code == 0, out
        for name, n in REPO_PATCHES.items():
            assert f"{name}: already applied ({n} files), nothing to do" in out, out

        code, out = cli_in_sglang("revert")
        assert code == 0, out
        for name, n in REPO_PATCHES.items():
            assert f"{name}: reverted {n} of {n} files" in out, out
        code, out = cli_in_sglang("check")
        assert code == cli.EXIT_NOT_APPLIED, out
        assert states(out) == {p: "not applied" for p in files}
        code, out = cli_in_sglang("revert")
        assert code == 0, out
        for name, n in REPO_PATCHES.items():
            assert f"{name}: already not applied ({n} files), nothing to do" in out, out
    finally:
        code, out = cli_in_sglang("apply")
    assert code == 0, out
    for name, n in REPO_PATCHES.items():
        assert f"{name}: applied {n} of {n} files" in out, out
    code, out = cli_in_sglang("check")
    assert code == 0 and states(out) == {p: "applied" for p in files}, out


@pytest.mark.sglang
def test_cli_conflict_on_the_sglang_env(sglang_patched: Path, tmp_path: Path) -> None:
    """A variant of the patch that differs in one added line: that file is in conflict with the
    applied install, the others read as applied, and apply refuses without touching anything."""
    real = default_patch_dir() / PROBE
    text = real.read_text()
    old = "+    # and on device or host (Optional for tree caches that cannot tell).\n"
    assert text.count(old) == 1
    (tmp_path / real.name).write_text(text.replace(old, old.replace("tell", "say")))
    code, out = cli_in_sglang("check", "--patch-dir", str(tmp_path))
    assert code == cli.EXIT_CONFLICT, out
    got = states(out)
    assert got.pop("sglang/srt/managers/io_struct.py") == "conflict"
    assert set(got.values()) == {"applied"} and len(got) == 6
    code, out = cli_in_sglang("apply", "--patch-dir", str(tmp_path))
    assert code == cli.EXIT_CONFLICT and "nothing was changed" in out
    code, out = cli_in_sglang("check")
    assert code == 0, out
