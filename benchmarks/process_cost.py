"""What a process tree costs the machine (CPU seconds, resident memory) and its CPU priority,
with psutil.

A router under test may fork (`--processes N`), and the peers run as one process or a Python
launcher with children; counting the whole tree makes their costs comparable. A process that
exits between listing and reading is skipped (its CPU seconds are lost, so a tree whose
children come and go reads low).
"""

from __future__ import annotations

import psutil


def _tree(pid: int) -> list[psutil.Process]:
    """Process `pid` and all its descendants; empty once it is gone."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_cpu_rss(pid: int) -> tuple[float, int]:
    """User+system CPU seconds and RSS bytes of process `pid` and all its descendants; (0, 0)
    once it is gone."""
    cpu, rss = 0.0, 0
    for p in _tree(pid):
        try:
            with p.oneshot():
                t = p.cpu_times()
                cpu += t.user + t.system
                rss += p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return cpu, rss


def renice(pids: list[int], value: int) -> int:
    """Sets the nice value of these processes and all their descendants; how many were set."""
    done = 0
    for pid in pids:
        for p in _tree(pid):
            try:
                p.nice(value)
            except psutil.NoSuchProcess:
                continue
            done += 1
    return done
