"""SGLang 0.5.23's own UnifiedRadixCache on CPU pools, for the scripts beside this file (they run
in the CPU SGLang env, .venv-sglang, with the probe patch applied). Importing this module installs
the CPU stand-ins (smetric_router.sglang_cpu) before anything imports sglang."""

from __future__ import annotations

from smetric_router.sglang_cpu import install

install()

import warnings  # noqa: E402
from array import array  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402
from sglang.srt.runtime_context import get_parallel  # noqa: E402
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler  # noqa: E402

warnings.filterwarnings("ignore")

PAGE = 4
A = list(range(1, 17))  # 4 pages
B = list(range(1, 9)) + list(range(50, 58))  # shares A's first 2 pages


def build(
    backend: str | None, *, hicache: bool, size: int = 256, storage_dir: str | None = None,
    events: bool = True,
) -> tuple[UnifiedRadixCache, Any]:  # fmt: skip
    """A cache with its allocator. ``backend`` None takes SGLang's default tree core (Rust, or
    SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND). HiCache: write-through to a host pool twice the
    device pool, direct copies (the CPU stand-in for sgl_kernel's); with ``storage_dir``, an L3
    behind it: SGLang's own file storage backend in that folder."""
    args = ServerArgs(
        model_path="dummy",
        device="cpu",
        page_size=PAGE,
        enable_hierarchical_cache=hicache,
        hicache_ratio=2.0,
        hicache_io_backend="direct",
        hicache_mem_layout="layer_first",
        hicache_write_policy="write_through",
        hicache_storage_backend="file" if storage_dir else None,
        file_storage_path=storage_dir,
    )
    set_global_server_args_for_scheduler(args)
    if storage_dir:  # the storage controller reads this rank's place in TP/PP/CP
        get_parallel().override_permanently(
            tp_rank=0, pp_rank=0, attn_cp_rank=0, attn_tp_rank=0, attn_dp_rank=0, attn_dcp_rank=0
        )
    kv = MHATokenToKVPool(
        size=size, page_size=PAGE, dtype=torch.bfloat16, head_num=1, head_dim=8, layer_num=2,
        device="cpu", enable_memory_saver=False,
    )  # fmt: skip
    alloc = PagedTokenToKVPoolAllocator(
        size=size, page_size=PAGE, dtype=torch.bfloat16, device="cpu", kvcache=kv, need_sort=False
    )
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=ReqToTokenPool(
            size=8, max_context_len=512, device="cpu", enable_memory_saver=False
        ),
        token_to_kv_pool_allocator=alloc,
        page_size=PAGE,
        tree_components=(ComponentType.FULL,),
        enable_kv_cache_events=events,
        tree_core_backend=backend,
    )
    cache = UnifiedRadixCache(params=params)
    if hicache:
        cache.init_hicache(args, params)
    return cache, alloc


def key(ids: list[int]) -> RadixKey:
    return RadixKey(array("q", ids))


def insert(cache: UnifiedRadixCache, alloc: Any, ids: list[int]) -> None:
    cache.insert(InsertParams(key=key(ids), value=alloc.alloc(len(ids))))


def match(cache: UnifiedRadixCache, ids: list[int]) -> dict[str, int]:
    """SGLang's own answer: device_prefix_len and full_kv_hit_length (device or host)."""
    m = cache.match_prefix(MatchPrefixParams(key=key(ids)))
    return {"device": m.device_prefix_len, "full_kv": m.full_kv_hit_length}


def tiers(cache: UnifiedRadixCache, ids: list[int]) -> list[int | None]:
    """The patched probe: [device, device-or-host]."""
    return list(cache.match_prefix_tiers(ids))
