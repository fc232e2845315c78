"""The one prefix rule every tier shares: a prompt's pages count up to the first one not held."""

from __future__ import annotations

from collections.abc import Container, Iterable


def leading_run(held: Container[int], page_hashes: Iterable[int]) -> int:
    """How many leading pages of `page_hashes` are in `held`."""
    n = 0
    for h in page_hashes:
        if h not in held:
            break
        n += 1
    return n
