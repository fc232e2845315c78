"""The patched ``UnifiedRadixCache.match_prefix_tiers`` beside SGLang's own ``match_prefix``, with
SGLang's tree core selection (the Rust core by default, the Python one with
SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python), without and with the HiCache host tier. Runs in the
CPU SGLang env with the patch applied; prints ``RESULT <json>`` as its last line.
"""

from __future__ import annotations

import json
from typing import Any

from cpu_cache import A, B, build, insert, key, match, tiers
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache


def device_path(cache: UnifiedRadixCache, ids: list[int]) -> list[int]:
    """Key lengths of the nodes on ids' device path, from the core's read-only queries."""
    core = cache.tree_core
    (path,) = core.collect_path_info([core.match_full_device_prefix(key(ids))[1]])
    return [info.path_end - info.path_start for info in path]


def full_path(cache: UnifiedRadixCache, ids: list[int]) -> list[int]:
    """Key lengths of the nodes on ids' device-or-host path. match_prefix refreshes access ticks:
    call it last, with a key that ends where a node ends (so it splits nothing)."""
    core = cache.tree_core
    best = core.match_prefix(MatchPrefixParams(key=key(ids))).best_match_node
    (path,) = core.collect_path_info([getattr(best, "id", best)])
    return [info.path_end - info.path_start for info in path]


def device_only() -> dict[str, Any]:
    cache, alloc = build(None, hicache=False)
    insert(cache, alloc, A)
    cache.take_events()
    partial = A[:10] + [99] * 6
    out: dict[str, Any] = {"core": type(cache.tree_core).__name__}
    out["full"] = tiers(cache, A)
    out["partial"] = tiers(cache, partial)
    out["longer"] = tiers(cache, [*A, 5, 5])
    out["miss"] = tiers(cache, [7, 7, 7, 7])
    out["empty"] = tiers(cache, [])
    out["events_after_probes"] = len(cache.take_events())
    out["nodes_after_probes"] = device_path(cache, A)
    out["match_partial"] = match(cache, partial)
    out["nodes_after_match"] = device_path(cache, A)
    return out


def host_tier() -> dict[str, Any]:
    cache, alloc = build(None, hicache=True)
    out: dict[str, Any] = {"core": type(cache.tree_core).__name__}
    for ids in (A, B):
        insert(cache, alloc, ids)
    cache.writing_check(write_back=True)  # wait for the device->host write-through acks
    cache.check_hicache_events()
    cache.take_events()
    out["on_device"] = {"A": tiers(cache, A), "B": tiers(cache, B)}
    out["evicted"] = cache.evict(EvictParams(num_tokens=8)).num_tokens_evicted  # A's leaf: oldest
    out["events_evict"] = [[type(e).__name__, str(e.medium)] for e in cache.take_events()]
    out["after_evict"] = {"A": tiers(cache, A), "B": tiers(cache, B), "A12": tiers(cache, A[:12])}
    out["events_after_probes"] = len(cache.take_events())
    out["nodes_after_probes"] = full_path(cache, A)
    out["match_after_evict"] = {"A": match(cache, A), "B": match(cache, B)}
    cache.evict(EvictParams(num_tokens=64))
    out["device_empty"] = {"A": tiers(cache, A), "B": tiers(cache, B)}
    out["match_device_empty"] = match(cache, A)
    out["host_evicted"] = cache.evict_host(64)
    out["host_empty"] = {"A": tiers(cache, A), "B": tiers(cache, B)}
    return out


def look(cache: UnifiedRadixCache, ids: list[int], how: str) -> None:
    if how == "probe":
        tiers(cache, ids)
    else:
        match(cache, ids)


def device_lru(how: str) -> list[int | None]:
    """Insert A then B (A older), look at A, evict one device leaf: the least recently used goes."""
    cache, alloc = build(None, hicache=True)
    for ids in (A, B):
        insert(cache, alloc, ids)
    cache.writing_check(write_back=True)
    look(cache, A, how)
    cache.evict(EvictParams(num_tokens=8))
    seen: list[int | None] = tiers(cache, A) + tiers(cache, B)
    return seen


def host_lru(how: str) -> list[int | None]:
    """A's and B's leaves both on host only (A older), look at A, evict one host leaf."""
    cache, alloc = build(None, hicache=True)
    for ids in (A, B):
        insert(cache, alloc, ids)
    cache.writing_check(write_back=True)
    cache.evict(EvictParams(num_tokens=16))
    look(cache, A, how)
    cache.evict_host(8)
    seen: list[int | None] = tiers(cache, A) + tiers(cache, B)
    return seen


def main() -> None:
    result = {
        "device_only": device_only(),
        "host_tier": host_tier(),
        "device_lru": {how: device_lru(how) for how in ("probe", "match")},
        "host_lru": {how: host_lru(how) for how in ("probe", "match")},
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
