"""The CPU stand-ins change nothing where CUDA is available, and on CPU replace exactly the
CUDA-only primitives SGLang touches (checked in the CPU SGLang env, on SGLang's own modules)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sglang_env import run_sglang_script

pytestmark = pytest.mark.sglang

SCRIPT = Path(__file__).parent / "stand_ins.py"


def test_nothing_changes_on_a_gpu_node() -> None:
    out = run_sglang_script(SCRIPT, "cuda", timeout=300)
    assert out == {"installed": False, "vllm": False, "torchvision": False, "hook": False,
                   "event_unchanged": True}  # fmt: skip


def test_cpu_stand_ins_replace_the_cuda_only_primitives() -> None:
    out = run_sglang_script(SCRIPT, "cpu", timeout=300)
    assert out == {
        "installed": True,
        "host_register_noop": True,
        "copied": [[0.0, 1.0], [2.0, 3.0]],
        "sender_host_indices": False,
        "event_query": True,
    }
