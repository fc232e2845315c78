"""The L3 KV-event patch inside SGLang 0.5.23's own classes (CPU SGLang env, .venv-sglang): a real
UnifiedRadixCache with HiCache write-through and SGLang's file storage backend as L3, with both
tree cores; the storage writes run on the controller's own backup thread.

sglang_scripts/l3_events.py drives the scenarios and prints every event SGLang queued as
[type, medium, block_hashes, parent_block_hash, token_ids]; the L3 events (medium EXTERNAL) are
checked here against the device (GPU) events of the same pages.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.patches.conftest import SCRIPTS
from tests.sglang_env import run_sglang_script

pytestmark = pytest.mark.sglang

CORE_ENV = "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"
CORE_CLASS = {"python": "UnifiedTreeCore", "rust": "RustUnifiedTreeCore"}
Row = list[Any]


@pytest.fixture(scope="module", params=["python", "rust"])
def run(request: pytest.FixtureRequest, sglang_patched: Path) -> dict[str, Any]:
    core: str = request.param
    env = {CORE_ENV: "python" if core == "python" else None}
    result: dict[str, Any] = run_sglang_script(SCRIPTS / "l3_events.py", env=env, timeout=300)
    assert result["core"] == CORE_CLASS[core]
    return result


def medium(rows: list[Row], name: str) -> list[Row]:
    return [r for r in rows if r[1] == name]


def pages(rows: list[Row]) -> list[tuple[int, int | None, list[int]]]:
    """(hash, parent, 4 tokens) per page of a list of BlockStored rows, in order."""
    out = []
    for _, _, hashes, parent, tokens in rows:
        for i, h in enumerate(hashes):
            out.append((h, parent if i == 0 else hashes[i - 1], tokens[4 * i : 4 * i + 4]))
    return out


def test_a_backup_announces_its_pages_as_the_device_events_do(run: dict[str, Any]) -> None:
    for name in ("A", "B"):
        gpu, l3 = medium(run[name], "GPU"), medium(run[name], "EXTERNAL")
        assert len(l3) == 1 and l3[0][0] == "BlockStored"
        assert pages(l3) == pages(gpu)  # same int64 hashes, parents and token ids
    a = medium(run["A"], "EXTERNAL")[0]
    assert a[3] is None and a[4] == list(range(1, 17))  # A starts at the root
    b = medium(run["B"], "EXTERNAL")[0]
    assert b[3] == a[2][1] and b[4] == list(range(50, 58))  # B continues A's 2nd page
    assert run["files_after_A"] == 4


def test_a_node_split_after_the_write_keeps_the_parent(run: dict[str, Any]) -> None:
    """C's write was held in the backend while D split C's node: the event still names C's
    first page's parent (A's 2nd page), and D's own page follows."""
    assert run["C_held"]
    gpu = pages(medium(run["C_D"], "GPU"))
    l3 = medium(run["C_D"], "EXTERNAL")
    assert [r[4] for r in l3] == [list(range(60, 68)), list(range(90, 94))]
    assert pages(l3) == gpu
    assert l3[0][3] == medium(run["A"], "EXTERNAL")[0][2][1]


def test_only_the_pages_the_backend_stored(run: dict[str, Any]) -> None:
    """Per-page results (zero-copy backends such as Mooncake): E's 2nd page failed, so two runs,
    the second chained to the missing page as in the device chain; a batch refused as a whole
    (one bool) announces nothing."""
    gpu = pages(medium(run["E"], "GPU"))
    l3 = medium(run["E"], "EXTERNAL")
    assert [len(r[2]) for r in l3] == [1, 2]
    assert pages(l3) == [gpu[0], gpu[2], gpu[3]]
    assert l3[1][3] == gpu[1][0]
    assert medium(run["F"], "EXTERNAL") == [] and len(medium(run["F"], "GPU")) == 1


def test_namespaced_pages_and_the_switch_announce_nothing(run: dict[str, Any]) -> None:
    assert medium(run["N"], "EXTERNAL") == [] and len(medium(run["N"], "GPU")) == 1
    assert medium(run["G_off"], "EXTERNAL") == [] and len(medium(run["G_off"], "GPU")) == 1


def test_a_storage_clear_removes_what_was_announced(run: dict[str, Any]) -> None:
    """BlockRemoved(EXTERNAL) lists every page announced since the last clear (A, B, C, D, E's
    stored pages); the backup in flight during the clear (G's second half, written after it) is
    not announced; a second clear has nothing to list."""
    assert run["clear_ok"] and run["files_after_clear"] == 0
    announced = [h for k in ("A", "B", "C_D", "E") for h, _, _ in pages(medium(run[k], "EXTERNAL"))]
    removed = [r for r in run["clear"] if r[1] == "EXTERNAL"]
    assert [r[0] for r in removed] == ["BlockRemoved"]
    assert sorted(removed[0][2]) == sorted(announced) and len(announced) == 12
    assert run["G_held"] and run["files_after_G"] == 2  # G's pages reached the store after all
    assert run["clear_again_ok"] and run["clear_again"] == []
