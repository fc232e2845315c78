"""How a policy knows whether a request follows up an earlier turn.

Chat requests carry their history, so the feature extractor counts assistant messages. Raw prompts
(/generate, /v1/completions) carry a turn only when the client sends a hint; otherwise the turn is
inferred statelessly from the view: a follow-up's private history sits on the worker that served its
previous turn and nowhere else, while a first request shares at most what many workers hold (the
system prompt). So a hit held by the best worker at least one page beyond the second-best worker's
hit marks a follow-up. No per-session state is kept anywhere.
"""

from __future__ import annotations

from collections.abc import Sequence

from smetric_router.core.types import RequestFeatures, WorkerView


def exclusive_hit(workers: Sequence[WorkerView]) -> int:
    """Tokens the best-hit worker holds beyond the second best."""
    hits = sorted((w.hit for w in workers), reverse=True)
    if not hits:
        return 0
    return hits[0] - (hits[1] if len(hits) > 1 else 0)


def resolve_turn(features: RequestFeatures, workers: Sequence[WorkerView]) -> int:
    if features.turn is not None:
        return features.turn
    if len(workers) > 1 and exclusive_hit(workers) >= max(1, features.page_size):
        return 1
    return 0
