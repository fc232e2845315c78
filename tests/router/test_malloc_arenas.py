"""The router caps glibc's malloc arenas (router/limits.py): its threads must share them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Threads allocating blocks past pymalloc's 512-byte limit go to malloc; glibc gives each
# thread that finds the arenas busy a new one. malloc_stats() prints one "Arena N:" per arena.
_SCRIPT = """
import ctypes, sys, threading
from smetric_router.router.limits import limit_malloc_arenas
applied = limit_malloc_arenas() if sys.argv[1] == "limit" else False
start = threading.Barrier(8)
def churn():
    start.wait()
    for _ in range(20000):
        [bytearray(4096) for _ in range(8)]
threads = [threading.Thread(target=churn) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print("applied", applied, flush=True)
ctypes.CDLL(None).malloc_stats()
"""


def _arenas(mode: str) -> tuple[bool, int]:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, mode], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return "applied True" in out.stdout, out.stderr.count("Arena ")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_router_threads_share_at_most_two_malloc_arenas() -> None:
    _, free_arenas = _arenas("free")
    applied, limited = _arenas("limit")
    if free_arenas == 0:
        pytest.skip("not glibc: malloc_stats prints no arenas")
    assert free_arenas > 2  # without the cap the threads spread over arenas of their own
    assert applied and 1 <= limited <= 2


def test_an_operators_malloc_arena_max_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    from smetric_router.router.limits import limit_malloc_arenas

    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_malloc_arenas() is False
