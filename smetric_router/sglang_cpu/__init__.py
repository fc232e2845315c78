"""CPU stand-ins that let SGLang 0.5.23 serve on a machine without a GPU (our tests and CI).

SGLang's scheduler, radix cache, HiCache, KV-event publisher and HTTP server run unchanged; only
CUDA-only primitives they touch are replaced, each by the plain-torch operation it stands for:

- ``torchvision``: SGLang's configs import it at module level; PyPI's build does not import beside
  CPU torch. A placeholder is installed after transformers has cached "torchvision unavailable",
  so transformers keeps its PIL paths.
- ``vllm._custom_ops``: imported by ``RotaryEmbedding.__init__`` off CUDA, used only by
  ``forward_cuda``; we run ``forward_native``.
- HiCache host pool: ``cudaHostRegister`` becomes a no-op; the ``sgl_kernel`` device<->host copies
  become tensor indexing (same pages, same layout).
- PD (Mooncake transfer): the sender takes the page-index branch instead of pinned host indices,
  and ``torch.cuda.Event`` becomes a no-op (a CPU forward pass is synchronous).

Nothing here runs unless a worker process sets ``SMETRIC_SGLANG_CPU=1`` (the launcher does it for
``device: cpu`` workers, through ``site/sitecustomize.py`` on ``PYTHONPATH``, which reaches the
scheduler and detokenizer processes SGLang spawns), and every stand-in is skipped when CUDA is
available: on GPU nodes SGLang runs exactly as shipped.
"""

from __future__ import annotations

import enum
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

ENV_FLAG = "SMETRIC_SGLANG_CPU"

_Hook = Callable[[types.ModuleType], None]


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _placeholder(name: str) -> types.ModuleType:
    mod = types.ModuleType(name)

    def missing(attr: str) -> Any:
        raise AttributeError(f"{name}.{attr}: placeholder module (not installed on this machine)")

    mod.__getattr__ = missing  # type: ignore[method-assign]
    sys.modules[name] = mod
    return mod


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def install_torchvision_placeholder() -> None:
    if "torchvision" in sys.modules or _importable("torchvision"):
        return
    try:
        from transformers.utils import import_utils
    except ImportError:
        pass
    else:
        import_utils.is_torchvision_available()  # lru-cached False before the placeholder exists
    tv = _placeholder("torchvision")
    tvt = _placeholder("torchvision.transforms")
    tvf = _placeholder("torchvision.transforms.functional")
    # importlib.util.find_spec raises ValueError on a module whose __spec__ is None; datasets
    # (imported by sglang.benchmark.serving) asks find_spec("torchvision") at import
    for mod in (tv, tvt, tvf):
        mod.__spec__ = importlib.machinery.ModuleSpec(mod.__name__, None)

    class InterpolationMode(enum.Enum):
        NEAREST = "nearest"
        BILINEAR = "bilinear"
        BICUBIC = "bicubic"
        BOX = "box"
        HAMMING = "hamming"
        LANCZOS = "lanczos"

    tvf.InterpolationMode = InterpolationMode  # type: ignore[attr-defined]
    tvt.InterpolationMode = InterpolationMode  # type: ignore[attr-defined]
    tvt.functional = tvf  # type: ignore[attr-defined]
    tv.transforms = tvt  # type: ignore[attr-defined]


def install_vllm_placeholder() -> None:
    if "vllm" in sys.modules or _importable("vllm"):
        return

    def rotary_embedding(*_a: object, **_k: object) -> None:
        raise RuntimeError("vllm._custom_ops placeholder: forward_cuda is not used on CPU")

    vllm = types.ModuleType("vllm")
    ops = types.ModuleType("vllm._custom_ops")
    ops.rotary_embedding = rotary_embedding  # type: ignore[attr-defined]
    vllm._custom_ops = ops  # type: ignore[attr-defined]
    sys.modules["vllm"] = vllm
    sys.modules["vllm._custom_ops"] = ops


# --- CUDA-only primitives, replaced after their module is imported ------------------------------


def _host_pool_common(m: types.ModuleType) -> None:
    m._cuda_host_register = lambda *a, **k: None  # type: ignore[attr-defined]


def _transfer_kv_direct(
    src_layers: Sequence[Any], dst_layers: Sequence[Any], src_indices: Any, dst_indices: Any,
    page_size: int,
) -> None:  # fmt: skip
    for s, d in zip(src_layers, dst_layers, strict=True):
        d[dst_indices] = s[src_indices]


def _transfer_lf_pf_all_layer(
    src_ptrs: Sequence[Any], dst_ptrs: Sequence[Any], src_indices: Any, dst_indices: Any,
    page_size: int,
) -> None:  # fmt: skip
    # device layer-first [k_l0..k_lN, v_l0..v_lN] -> host page-first [page, layer, page_size, ...]
    layers = len(src_ptrs) // len(dst_ptrs)
    pages = dst_indices[::page_size] // page_size
    for j, dst in enumerate(dst_ptrs):
        for layer in range(layers):
            src = src_ptrs[j * layers + layer]
            dst[pages, layer] = src[src_indices].view(-1, page_size, *src.shape[1:])


def _transfer_pf_lf_per_layer(
    src_ptrs: Sequence[Any], dst_ptrs: Sequence[Any], src_indices: Any, dst_indices: Any,
    layer_id: int, page_size: int,
) -> None:  # fmt: skip
    pages = src_indices[::page_size] // page_size
    for src, dst in zip(src_ptrs, dst_ptrs, strict=True):
        dst[dst_indices] = src[pages, layer_id].reshape(-1, *dst.shape[1:])


def _host_pool_mha(m: types.ModuleType) -> None:
    m.transfer_kv_direct = _transfer_kv_direct  # type: ignore[attr-defined]
    m.transfer_kv_all_layer_direct_lf_pf = _transfer_lf_pf_all_layer  # type: ignore[attr-defined]
    m.transfer_kv_per_layer_direct_pf_lf = _transfer_pf_lf_per_layer  # type: ignore[attr-defined]


def _mooncake_conn(m: types.ModuleType) -> None:
    # the host-tensor branch pins memory and records a CUDA event; the page-index branch is plain
    m.MooncakeKVSender.supports_host_tensor_indices = False


HOOKS: dict[str, _Hook] = {
    "sglang.srt.mem_cache.pool_host.common": _host_pool_common,
    "sglang.srt.mem_cache.pool_host.mha": _host_pool_mha,
    "sglang.srt.disaggregation.mooncake.conn": _mooncake_conn,
}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a hook on a module right after it executes, before anyone imports names from it."""

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        hook = HOOKS.get(name)
        if hook is None:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            run(module)
            hook(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


class _NoCudaEvent:
    def __init__(self, *_a: object, **_k: object) -> None:
        pass

    def record(self, *_a: object, **_k: object) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait(self, *_a: object, **_k: object) -> None:
        pass

    def query(self) -> bool:
        return True


def install() -> bool:
    """Install every stand-in; False (and nothing changed) where CUDA is available."""
    if _cuda_available():
        return False
    install_torchvision_placeholder()
    install_vllm_placeholder()
    for name, hook in HOOKS.items():
        if name in sys.modules:
            hook(sys.modules[name])
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
    import torch

    torch.cuda.Event = _NoCudaEvent
    return True
