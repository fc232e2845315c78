"""benchmarks.process_cost counts a router's whole process tree: a forked worker's CPU belongs to
the router that forked it."""

from __future__ import annotations

import subprocess
import sys

import psutil

from benchmarks.process_cost import renice, tree_cpu_rss

# A child that forks a grandchild; the grandchild burns `BURN_S` of CPU, then both report and
# wait for stdin to close (so both are alive when the parent reads them).
TREE = """
import os, sys, time
r, w = os.pipe()
if os.fork() == 0:
    t = time.process_time()
    while time.process_time() - t < float(sys.argv[1]):
        pass
    os.write(w, b"x")
    sys.stdin.read()
    os._exit(0)
os.read(r, 1)
print("burnt", flush=True)
sys.stdin.read()
"""
BURN_S = 0.4


def test_the_cpu_of_a_grandchild_counts_and_a_gone_process_reads_zero() -> None:
    proc = subprocess.Popen([sys.executable, "-c", TREE, str(BURN_S)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.readline() == b"burnt\n"
        cpu, rss = tree_cpu_rss(proc.pid)
        # the child itself only waited; the burn is the grandchild's
        own = sum(psutil.Process(proc.pid).cpu_times()[:2])
        assert cpu >= own + BURN_S * 0.9
        assert rss > 2 * (1 << 20)  # two Python interpreters
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)
    assert tree_cpu_rss(proc.pid) == (0.0, 0)


def test_renice_lowers_a_process_and_its_descendants() -> None:
    proc = subprocess.Popen([sys.executable, "-c", TREE, "0"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.readline() == b"burnt\n"
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        assert len(tree) == 2
        assert renice([proc.pid], 7) == 2
        assert [p.nice() for p in tree] == [7, 7]
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)
    assert renice([proc.pid], 7) == 0  # gone: nothing to set
