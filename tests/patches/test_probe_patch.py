"""The SGLang probe patch is a well-formed unified diff over the expected files (no network)."""

from __future__ import annotations

import re
from pathlib import Path

PATCH = Path(__file__).parents[2] / "patches" / "sglang-0.5.23-smetric-prefix-probe.patch"
EXPECTED = {
    "sglang/srt/entrypoints/http_server.py",
    "sglang/srt/managers/io_struct.py",
    "sglang/srt/managers/scheduler.py",
    "sglang/srt/managers/tokenizer_control_mixin.py",
    "sglang/srt/mem_cache/unified_cache/unified_tree_core.py",
    "sglang/srt/mem_cache/unified_cache/unified_tree_core_interface.py",
    "sglang/srt/mem_cache/unified_radix_cache.py",
}
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def parse(text: str) -> dict[str, list[str]]:
    """File path -> its added lines; raises AssertionError where the diff is malformed."""
    lines = text.splitlines()
    added: dict[str, list[str]] = {}
    i = 0
    while i < len(lines):
        assert lines[i].startswith("--- a/"), f"line {i + 1}: expected '--- a/': {lines[i]!r}"
        old, new = lines[i][len("--- a/") :], lines[i + 1]
        assert new == f"+++ b/{old}", f"line {i + 2}: header pair mismatch: {new!r}"
        path, i = old, i + 2
        added[path] = []
        assert HUNK.match(lines[i]), f"line {i + 1}: file without a hunk"
        while i < len(lines) and (m := HUNK.match(lines[i])):
            old_left = int(m[2] if m[2] is not None else 1)
            new_left = int(m[4] if m[4] is not None else 1)
            i += 1
            while old_left or new_left:
                line = lines[i]
                tag = line[:1]
                assert tag in " -+", f"line {i + 1}: bad hunk line {line!r}"
                old_left -= tag in " -"
                new_left -= tag in " +"
                assert old_left >= 0 and new_left >= 0, f"line {i + 1}: hunk longer than counts"
                if tag == "+":
                    added[path].append(line[1:])
                i += 1
    return added


def test_patch_is_well_formed_over_the_expected_files() -> None:
    added = parse(PATCH.read_text())
    assert set(added) == EXPECTED


def test_patch_adds_route_control_request_and_read_only_walk() -> None:
    added = {path: "\n".join(lines) for path, lines in parse(PATCH.read_text()).items()}
    assert '@app.post("/smetric/prefix_match")' in added["sglang/srt/entrypoints/http_server.py"]
    assert "class SmetricPrefixMatchReq(BaseReq" in added["sglang/srt/managers/io_struct.py"]
    assert "class SmetricPrefixMatchReqOutput(BaseReq" in added["sglang/srt/managers/io_struct.py"]
    mixin = added["sglang/srt/managers/tokenizer_control_mixin.py"]
    assert '("smetric_prefix_match", SmetricPrefixMatchReqOutput)' in mixin
    scheduler = added["sglang/srt/managers/scheduler.py"]
    assert "(SmetricPrefixMatchReq, self.smetric_prefix_match)" in scheduler
    walk = added["sglang/srt/mem_cache/unified_cache/unified_tree_core.py"]
    assert "def match_prefix_tiers" in walk
    # Read-only: the walk must not split nodes nor refresh access times.
    assert "_split_node" not in walk and "last_access_time" not in walk


def test_parser_rejects_a_miscounted_hunk() -> None:
    broken = PATCH.read_text().replace("@@ -157,6 +157,7 @@", "@@ -157,6 +157,9 @@", 1)
    assert broken != PATCH.read_text()
    try:
        parse(broken)
    except (AssertionError, IndexError):
        return
    raise AssertionError("a hunk with wrong counts parsed")


def test_host_figure_without_a_read_only_host_walk() -> None:
    """Tree cores without a host walk (the Rust core): host = device without a host tier;
    otherwise the cache walks like touch_prefix and applies the walk's cache actions."""
    added = {path: "\n".join(lines) for path, lines in parse(PATCH.read_text()).items()}
    iface = added["sglang/srt/mem_cache/unified_cache/unified_tree_core_interface.py"]
    assert 'None if getattr(self, "enable_hicache", True) else device_len' in iface
    cache = added["sglang/srt/mem_cache/unified_radix_cache.py"]
    assert "result = self.tree_core.match_prefix(MatchPrefixParams(key=key))" in cache
    assert "self._apply_cache_actions(result.cache_actions)" in cache
    assert "return device_len, max(device_len, result.full_kv_hit_length)" in cache
