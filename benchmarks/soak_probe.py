"""Runs the router with a memory probe, for soak runs: where does its RSS go?

    python -m benchmarks.soak --requests 100000 --out /tmp/soak \\
        --router-python-args benchmarks/soak_probe.py --router-env PROBE_DIR=/tmp/probe

Every PROBE_EVERY_S seconds (default 10) it appends to PROBE_DIR/probe.log: the router's RSS,
glibc's malloc totals (`mallinfo2`: in use and free, over all arenas, so native allocations
that tracemalloc cannot see, e.g. libzmq's queued messages, show too) and each KV-event feed's
state (last seq applied, last live seq read, resets, stalls) with the coroutine it is awaiting.
With PROBE_TRACEMALLOC=N (frames) it traces the Python heap too: SIGUSR1 writes a snapshot to
PROBE_DIR (compare two with `Snapshot.compare_to`). SIGUSR2 runs `malloc_trim(0)` and logs RSS
before and after (what glibc holds freed). Linux/glibc only; a diagnostic, not for production.
"""

from __future__ import annotations

import ctypes
import gc
import os
import runpy
import signal
import sys
import threading
import time
import tracemalloc
from typing import Any

DIR = os.environ.get("PROBE_DIR", "/tmp/soak-probe")
EVERY_S = float(os.environ.get("PROBE_EVERY_S", "10"))
FRAMES = int(os.environ.get("PROBE_TRACEMALLOC", "0"))
_FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
           "fordblks", "keepcost")  # fmt: skip


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _FIELDS]


_libc = ctypes.CDLL("libc.so.6")
_libc.mallinfo2.restype = _MallInfo2
_t0 = time.monotonic()
os.makedirs(DIR, exist_ok=True)
_log = open(os.path.join(DIR, "probe.log"), "a", buffering=1)  # noqa: SIM115 (process-long)


def _write(line: str) -> None:
    _log.write(f"{time.monotonic() - _t0:7.1f}s {line}\n")


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _malloc() -> str:
    m = _libc.mallinfo2()
    mb = 1 << 20
    return f"malloc in use {m.uordblks / mb:.1f} MB, free {m.fordblks / mb:.1f} MB"


def _awaiting(task: Any) -> str:
    """The chain of coroutines a feed's task is suspended in (read from another thread: a
    diagnostic snapshot, not exact)."""
    out: list[str] = []
    coro = task.get_coro() if task is not None else None
    while coro is not None and len(out) < 10:
        frame = getattr(coro, "cr_frame", None)
        if frame is None:
            break
        out.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
        coro = getattr(coro, "cr_await", None)
    return ">".join(out)


def _feeds() -> str:
    from smetric_router.cluster.subscriber import KvEventFeed

    parts = []
    for f in [o for o in gc.get_objects() if isinstance(o, KvEventFeed)]:
        st = f.state()
        parts.append(
            f"{f.url} last={st.last_seq} live={f.live_seq} resets={st.resets} "
            f"stalls={st.stalls} at={_awaiting(f._task)}"
        )
    return "; ".join(parts)


def _loop() -> None:
    while True:
        time.sleep(EVERY_S)
        traced = ""
        if FRAMES:
            traced = f", traced {tracemalloc.get_traced_memory()[0] / (1 << 20):.1f} MB"
        _write(f"rss {_rss_mb():.1f} MB, {_malloc()}{traced}")
        _write(f"  feeds: {_feeds()}")


def _snapshot(*_: object) -> None:
    if FRAMES:
        path = os.path.join(DIR, f"snapshot_{time.monotonic() - _t0:07.0f}.pkl")
        tracemalloc.take_snapshot().dump(path)
        _write(f"snapshot {path}")


def _trim(*_: object) -> None:
    before, t = _rss_mb(), time.perf_counter()
    _libc.malloc_trim(0)
    ms = (time.perf_counter() - t) * 1e3
    _write(f"malloc_trim(0): rss {before:.1f} -> {_rss_mb():.1f} MB in {ms:.1f} ms; {_malloc()}")


def main() -> None:
    if FRAMES:
        tracemalloc.start(FRAMES)
    threading.Thread(target=_loop, name="soak-probe", daemon=True).start()
    signal.signal(signal.SIGUSR1, _snapshot)
    signal.signal(signal.SIGUSR2, _trim)
    args = sys.argv[1:]
    if args[:2] == ["-m", "smetric_router"]:  # the soak puts these after the python args
        args = args[2:]
    sys.argv = ["smetric_router", *args]
    runpy.run_module("smetric_router", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
