"""Run in the CPU SGLang env: what smetric_router.sglang_cpu.install() changes, with and without
CUDA. Prints `RESULT <json>`."""

from __future__ import annotations

import json
import sys

import torch

import smetric_router.sglang_cpu as cpu

if sys.argv[1] == "cuda":
    torch.cuda.is_available = lambda: True  # what a GPU node reports
    event = torch.cuda.Event
    installed = cpu.install()
    print("RESULT " + json.dumps({
        "installed": installed,
        "vllm": "vllm" in sys.modules,
        "torchvision": "torchvision" in sys.modules,
        "hook": any(type(f).__name__ == "_AfterImport" for f in sys.meta_path),
        "event_unchanged": torch.cuda.Event is event,
    }))  # fmt: skip
else:
    installed = cpu.install()
    import sglang.srt.mem_cache.pool_host.common as common
    import sglang.srt.mem_cache.pool_host.mha as mha

    src = [torch.arange(12.0).view(6, 2)]
    dst = [torch.zeros(6, 2)]
    mha.transfer_kv_direct(src, dst, torch.tensor([0, 1]), torch.tensor([4, 5]), 2)
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVSender

    print("RESULT " + json.dumps({
        "installed": installed,
        "host_register_noop": common._cuda_host_register(None) is None,
        "copied": dst[0][4:].tolist(),
        "sender_host_indices": MooncakeKVSender.supports_host_tensor_indices,
        "event_query": torch.cuda.Event().query(),
    }))  # fmt: skip
