"""The L3 KV-event patch inside SGLang 0.5.23's own classes: a real UnifiedRadixCache with HiCache
write-through and SGLang's own file storage backend as L3 (a temp folder), with SGLang's tree core
selection (Rust by default, Python with SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python). The storage
writes run on the controller's real backup thread; the acks are drained by the cache as the
scheduler does (check_hicache_events). Prints ``RESULT <json>`` as its last line: per scenario, the
events SGLang queued, as [type, medium, block_hashes, parent_block_hash, token_ids].

Page 4. A = 1..16; B = A's first 2 pages + 50..57 (splits A's node); C = A's first 2 pages +
60..67, split after its storage write was issued (by D = A's first 2 pages + 60..63 + 90..93).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from array import array
from typing import Any

from cpu_cache import A, B, build, insert
from sglang.srt.mem_cache.base_prefix_cache import InsertParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.mem_cache.utils import get_hash_str

C = A[:8] + list(range(60, 68))
D = A[:8] + list(range(60, 64)) + list(range(90, 94))
E = list(range(200, 216))
F = list(range(300, 316))
G = list(range(400, 416))
N = list(range(500, 516))  # inserted under an extra_key (a namespace)


def row(ev: Any) -> list[Any]:
    medium = getattr(ev, "medium", None)
    return [
        type(ev).__name__,
        None if medium is None else str(getattr(medium, "value", medium)),
        getattr(ev, "block_hashes", None),
        getattr(ev, "parent_block_hash", None),
        [int(t) for t in getattr(ev, "token_ids", [])],
    ]


def settle(cache: UnifiedRadixCache, seconds: float = 1.0) -> list[list[Any]]:
    """Device->host acks, the storage backups they start, and those backups' acks; then every
    event the cache queued."""
    cache.writing_check(write_back=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        cache.check_hicache_events()
        if not cache.ongoing_backup and not cache.ongoing_write_through:
            break
        time.sleep(0.02)
    return [row(e) for e in cache.take_events()]


class Gate:
    """Holds the storage backup thread inside a backend call until released."""

    def __init__(self, backend: Any, name: str) -> None:
        self.open, self.entered = threading.Event(), threading.Event()
        inner = getattr(backend, name)

        def held(*args: Any, **kwargs: Any) -> Any:
            self.entered.set()
            self.open.wait(30)
            return inner(*args, **kwargs)

        setattr(backend, name, held)
        self.backend, self.name = backend, name

    def release(self) -> None:
        self.open.set()
        delattr(self.backend, self.name)


def scenario(folder: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cache, alloc = build(None, hicache=True, size=512, storage_dir=folder)
    cc = cache.cache_controller
    backend = cc.storage_backend
    out["core"] = type(cache.tree_core).__name__
    out["set_func"] = cc.page_set_func.__name__
    cache.take_events()

    insert(cache, alloc, A)
    out["A"] = settle(cache)
    out["files_after_A"] = len(os.listdir(folder))
    insert(cache, alloc, B)
    out["B"] = settle(cache)

    # C's storage write is issued and held; D then splits C's node before the ack is drained
    gate = Gate(backend, "batch_set")
    insert(cache, alloc, C)
    cache.writing_check(write_back=True)
    out["C_held"] = gate.entered.wait(10)
    insert(cache, alloc, D)
    gate.release()
    out["C_D"] = settle(cache)

    # per-page results (the zero-copy path Mooncake takes): E's 2nd page fails, the others store
    cc.page_set_func = cc._page_set_zero_copy
    failed: set[str] = set()

    def batch_set_v1(keys: list[str], host_indices: Any, extra_info: Any = None) -> list[bool]:
        return [k not in failed for k in keys]

    backend.batch_set_v1 = batch_set_v1
    failed.add(get_hash_str(E, None, page_size=4)[1])  # the storage key of E's 2nd page
    insert(cache, alloc, E)
    out["E"] = settle(cache)

    # a whole batch refused (one bool for the batch, the generic path): nothing announced
    cc.page_set_func = cc._generic_page_set
    backend.batch_set = lambda *a, **k: False
    insert(cache, alloc, F)
    out["F"] = settle(cache)
    del backend.batch_set

    # a namespaced prompt (extra_key): stored, but announced in no L3 event
    key = RadixKey(array("q", N), extra_key="tenant-1")
    cache.insert(InsertParams(key=key, value=alloc.alloc(len(N))))
    out["N"] = settle(cache)

    # the env switch
    os.environ["SMETRIC_L3_KV_EVENTS"] = "0"
    insert(cache, alloc, G[:8])
    out["G_off"] = settle(cache)
    del os.environ["SMETRIC_L3_KV_EVENTS"]

    # clear with a backup in flight: announced pages listed; the in-flight one never announced
    gate = Gate(backend, "batch_set")
    insert(cache, alloc, G)
    cache.writing_check(write_back=True)
    out["G_held"] = gate.entered.wait(10)
    out["clear_ok"] = cache.clear_storage_backend()
    out["files_after_clear"] = len(os.listdir(folder))
    gate.release()
    out["clear"] = settle(cache)
    out["files_after_G"] = len(os.listdir(folder))
    out["clear_again_ok"] = cache.clear_storage_backend()
    out["clear_again"] = settle(cache)
    return out


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="smetric-l3-", ignore_cleanup_errors=True) as folder:
        print("RESULT " + json.dumps(scenario(folder)), flush=True)
    os._exit(0)  # the controller's storage threads are not daemons


if __name__ == "__main__":
    main()
