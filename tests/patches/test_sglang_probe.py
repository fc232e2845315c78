"""The probe patch inside SGLang 0.5.23's own classes (CPU SGLang env, .venv-sglang): the tree walk
on UnifiedRadixCache with both tree cores, the HiCache host tier, the scheduler handler and its
dispatcher entry, the IPC round trip, the DP fan-out and the HTTP route.

Token ids (page 4): A = 1..16 (4 pages), B = 1..8 then 50..57 (shares A's first 2 pages). Each
scenario's script is in sglang_scripts/ and prints what SGLang answered; the figures asserted here
follow from those inserts and evictions.
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


@pytest.fixture(scope="module", params=["python", "rust"])
def tiers(request: pytest.FixtureRequest, sglang_patched: Path) -> tuple[str, dict[str, Any]]:
    """(core, probe_tiers.py's result) with the Python core (env var) or SGLang's default (Rust)."""
    core: str = request.param
    env = {CORE_ENV: "python" if core == "python" else None}
    return core, run_sglang_script(SCRIPTS / "probe_tiers.py", env=env)


@pytest.fixture(scope="module")
def route(sglang_patched: Path) -> dict[str, Any]:
    result: dict[str, Any] = run_sglang_script(SCRIPTS / "probe_route.py", env={CORE_ENV: None})
    return result


def test_the_selected_tree_core_answers(tiers: tuple[str, dict[str, Any]]) -> None:
    core, r = tiers
    assert r["device_only"]["core"] == r["host_tier"]["core"] == CORE_CLASS[core]


def test_device_tier_figures(tiers: tuple[str, dict[str, Any]]) -> None:
    _, r = tiers
    d = r["device_only"]
    # no host tier: host == device; only page-aligned prefixes count
    assert d["full"] == [16, 16]
    assert d["partial"] == [8, 8]  # A[:10] + 6 others: 2 full pages
    assert d["longer"] == [16, 16]
    assert d["miss"] == [0, 0]
    assert d["empty"] == [0, 0]
    assert d["match_partial"] == {"device": 8, "full_kv": 8}  # SGLang's match_prefix agrees


def test_device_tier_probe_is_read_only(tiers: tuple[str, dict[str, Any]]) -> None:
    """The probe ends inside A's 16-token node without splitting it; match_prefix splits it."""
    _, r = tiers
    d = r["device_only"]
    assert d["nodes_after_probes"] == [16]
    assert d["nodes_after_match"] == [8, 8]
    assert d["events_after_probes"] == 0


def test_host_tier_figures_match_match_prefix(tiers: tuple[str, dict[str, Any]]) -> None:
    _, r = tiers
    h = r["host_tier"]
    assert h["on_device"] == {"A": [16, 16], "B": [16, 16]}
    # evicting 8 tokens takes A's leaf (9..16, the least recently used) to host only
    assert h["evicted"] == 8
    assert h["events_evict"] == [["BlockRemoved", "StorageMedium.GPU"]]
    assert h["after_evict"] == {"A": [8, 16], "B": [16, 16], "A12": [8, 12]}
    m = h["match_after_evict"]
    assert [m["A"]["device"], m["A"]["full_kv"]] == h["after_evict"]["A"]
    assert [m["B"]["device"], m["B"]["full_kv"]] == h["after_evict"]["B"]
    # every device page evicted: all on host
    assert h["device_empty"] == {"A": [0, 16], "B": [0, 16]}
    assert h["match_device_empty"] == {"device": 0, "full_kv": 16}
    # then the host tier emptied too: 8 shared + 8 + 8 tokens
    assert h["host_evicted"] == 24
    assert h["host_empty"] == {"A": [0, 0], "B": [0, 0]}
    assert h["events_after_probes"] == 0


def test_full_device_hit_leaves_the_lru_alone(tiers: tuple[str, dict[str, Any]]) -> None:
    """A then B inserted (A older); looking at A before evicting one leaf: after the probe A's leaf
    is still the victim, after match_prefix B's is. Read-only on both cores when the device holds
    the whole key."""
    _, r = tiers
    assert r["device_lru"]["probe"] == [8, 16, 16, 16]
    assert r["device_lru"]["match"] == [16, 16, 8, 16]


def test_host_walk_side_effects_per_core(tiers: tuple[str, dict[str, Any]]) -> None:
    """Past the device tier: the Python core walks host nodes read-only; the Rust core has no
    read-only host query, so the probe walks like SGLang's touch_prefix: it splits the node a
    probe ends in (A[:12] inside A's 8-token host leaf) and refreshes the path's recency (A's host
    leaf then outlives B's)."""
    core, r = tiers
    if core == "python":
        assert r["host_tier"]["nodes_after_probes"] == [8, 8]
        assert r["host_lru"]["probe"] == [8, 8, 8, 16]  # A's host leaf, the older, evicted
    else:
        assert r["host_tier"]["nodes_after_probes"] == [8, 4, 4]
        assert r["host_lru"]["probe"] == [8, 16, 8, 8]  # as after match_prefix
    assert r["host_lru"]["match"] == [8, 16, 8, 8]


def test_ipc_round_trip_keeps_the_request(route: dict[str, Any]) -> None:
    name, ids = route["ipc_req"]
    assert name == "SmetricPrefixMatchReq"
    assert ids == [list(range(1, 17)), list(range(1, 10)), [*range(1, 9), *range(50, 58)], []]


def test_scheduler_handler_on_the_default_core(route: dict[str, Any]) -> None:
    assert route["cores"] == ["RustUnifiedTreeCore", "UnifiedTreeCore"]
    # rank 0 after A's leaf went to host: A (8, 16), A[:9] (8, 8), B (16, 16), [] (0, 0)
    assert route["handler"] == [
        "SmetricPrefixMatchReqOutput",
        4,
        [8, 8, 16, 0],
        [16, 8, 16, 0],
        None,
    ]
    assert route["handler_unsupported"] == "prefix probe unsupported by object"
    assert route["communicator_spec"] == [["smetric_prefix_match", "SmetricPrefixMatchReqOutput"]]


def test_route_merges_dp_ranks_by_max(route: dict[str, Any]) -> None:
    # rank 1 holds A[:12] on device: A (12, 12), A[:9] (8, 8), B (8, 8)
    assert route["route"] == {
        "status": 200,
        "body": {
            "page_size": 4,
            "results": [
                {"device": 12, "host": 16},
                {"device": 8, "host": 8},
                {"device": 16, "host": 16},
            ],
        },
    }
    assert route["route_flat"]["body"]["results"] == [{"device": 12, "host": 16}]


def test_route_rejects_bad_bodies_and_unsupported_caches(route: dict[str, Any]) -> None:
    assert route["route_bad"] == [400, 400, 400]
    assert route["route_unsupported"] == {
        "status": 501,
        "body": {"error": {"message": "prefix probe unsupported by object"}},
    }
