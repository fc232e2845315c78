"""The one prefix rule every tier shares: a prompt's pages count up to the first one not held."""

from __future__ import annotations

from collections.abc import Container, Iterable
from itertools import takewhile


def leading_run(held: Container[int], page_hashes: Iterable[int]) -> int:
    """How many leading pages of `page_hashes` are in `held`."""
    # the loop runs in C (takewhile over the container's own __contains__): prompts are
    # thousands of pages and the simulator asks this at every admission
    return len(list(takewhile(held.__contains__, page_hashes)))
