"""Cyclic garbage collection made rare while a simulation runs.

A run creates millions of long-lived radix page nodes. At CPython's default thresholds (700
allocations) the collector rescans the young ones every few hundred pages and the whole heap
every few hundred thousand: 40 % of a run's time on a 3,000-request slice of the study trace,
for garbage the simulator rarely makes (its structures hold no reference cycles). Collection
only frees memory, so the results are the same.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import ParamSpec, TypeVar

_YOUNG = 100_000  # allocations between young collections (default 700)

P = ParamSpec("P")
R = TypeVar("R")


@contextmanager
def rare_collections() -> Iterator[None]:
    saved = gc.get_threshold()
    gc.set_threshold(_YOUNG, saved[1], saved[2])
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def with_rare_collections(fn: Callable[P, R]) -> Callable[P, R]:
    @wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with rare_collections():
            return fn(*args, **kwargs)

    return run
