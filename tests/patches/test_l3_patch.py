"""The L3 KV-event patch: a well-formed diff over the expected files (no network), and the patch set
applied, checked and reverted on a pristine copy of the installed SGLang's files (marker sglang)."""

from __future__ import annotations

import base64
import hashlib
import shutil
from pathlib import Path

import pytest

from smetric_router.patches import cli
from smetric_router.patches.patchset import default_patch_dir, load_patch_dir
from tests.patches.test_probe_patch import parse
from tests.sglang_env import run_sglang

NAME = "sglang-0.5.23-smetric-l3-events.patch"
PATCH = default_patch_dir() / NAME
CONTROLLER = "sglang/srt/managers/cache_controller.py"
CACHE = "sglang/srt/mem_cache/unified_radix_cache.py"


def added() -> dict[str, str]:
    return {path: "\n".join(lines) for path, lines in parse(PATCH.read_text()).items()}


def test_patch_is_well_formed_over_the_expected_files() -> None:
    assert set(added()) == {CONTROLLER, CACHE}


def test_patch_adds_per_page_results_and_the_l3_events() -> None:
    controller, cache = added()[CONTROLLER], added()[CACHE]
    assert "self.page_set_ok: List[bool] = []" in controller
    assert "operation.page_set_ok.extend(success)" in controller
    assert "if not all(success):" in controller
    # emitted where SGLang drains a finished backup (the node is still host-locked there)
    assert "self._smetric_l3_stored(node_id, operation)" in cache
    assert "medium=StorageMedium.EXTERNAL" in cache
    assert "self._smetric_l3_cleared()" in cache
    assert "events = [*events, *self._smetric_l3_events]" in cache
    assert 'os.environ.get("SMETRIC_L3_KV_EVENTS", "1") != "0"' in cache


# --- on a pristine copy of the installed SGLang (.venv-sglang) -----------------------------------


def _record_hash(path: Path) -> str:
    digest = hashlib.sha256(path.read_bytes()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


@pytest.fixture
def pristine(tmp_path: Path) -> Path:
    """A site dir holding the files the patch set touches, as the SGLang wheel ships them: copied
    from the installed SGLang and reverted with the tool, then checked against the wheel's RECORD
    hashes."""
    proc = run_sglang(
        ["-c", "from smetric_router.patches.target import find_installed; "
               "print(find_installed().site_dir)"],
        timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    installed = Path(proc.stdout.split()[-1])
    site = tmp_path / "site"
    (info,) = installed.glob("sglang-0.5.23.dist-info")
    shutil.copytree(info, site / info.name)
    files = {s.path for p in load_patch_dir(default_patch_dir()) for s in p.sections}
    for rel in files | {"sglang/__init__.py"}:
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(installed / rel, site / rel)
    assert cli.main(["revert", "--site-dir", str(site)]) == cli.EXIT_OK
    record = {
        line.split(",")[0]: line.split(",")[1].removeprefix("sha256=")
        for line in (site / info.name / "RECORD").read_text().splitlines()
    }
    for rel in files:
        assert _record_hash(site / rel) == record[rel], f"{rel} is not the wheel's"
    return site


@pytest.mark.sglang
def test_the_l3_patch_alone_on_pristine_files(
    pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copyfile(PATCH, alone / NAME)
    args = ["--site-dir", str(pristine), "--patch-dir", str(alone)]
    before = {rel: (pristine / rel).read_bytes() for rel in (CONTROLLER, CACHE)}
    assert cli.main(["check", *args]) == cli.EXIT_NOT_APPLIED
    assert cli.main(["apply", *args]) == cli.EXIT_OK
    assert cli.main(["apply", *args]) == cli.EXIT_OK  # idempotent
    assert cli.main(["check", *args]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert f"{NAME}: applied 2 of 2 files" in out
    assert f"{NAME}: already applied (2 files), nothing to do" in out
    assert f"{NAME}: applied (2/2 files applied)" in out
    assert cli.main(["revert", *args]) == cli.EXIT_OK
    assert cli.main(["revert", *args]) == cli.EXIT_OK
    assert {rel: (pristine / rel).read_bytes() for rel in before} == before


@pytest.mark.sglang
def test_the_whole_set_on_pristine_files(
    pristine: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both patches change unified_radix_cache.py: applied together they check as applied and
    the file compiles; reverted together it is the wheel's file again."""
    args = ["--site-dir", str(pristine)]
    cache = pristine / CACHE
    orig = cache.read_bytes()
    assert cli.main(["apply", *args]) == cli.EXIT_OK
    assert cli.main(["check", *args]) == cli.EXIT_OK
    both = cache.read_text()
    compile(both, str(cache), "exec")
    assert "def match_prefix_tiers" in both and "def _smetric_l3_stored" in both
    assert cli.main(["revert", *args]) == cli.EXIT_OK
    assert cache.read_bytes() == orig
    capsys.readouterr()
