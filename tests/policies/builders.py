"""Builder fixtures: `cluster(w(load=3, hit=64), w(load=1))` is a view of workers w0, w1.

running defaults to None (no report), as in a view built before the first /v1/loads poll."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

from smetric_router.core.types import ClusterView, RequestFeatures, WorkerView
from smetric_router.policies import Policy


def w(
    load: float = 0,
    hit: int = 0,
    healthy: bool = True,
    text_match: int = 0,
    tree: int = 0,
    l3: int | None = 0,
    running: int | None = None,
    unprefilled: int = 0,
    recent: float = 0.0,
    prefill_only: bool = False,
) -> WorkerView:
    return WorkerView(
        url="",
        load=load,
        hit=hit,
        gpu_hit=hit,
        l3_hit=l3,
        healthy=healthy,
        text_match=text_match,
        text_tree_size=tree,
        running=running,
        unprefilled=unprefilled,
        recent_tokens=recent,
        prefill_only=prefill_only,
    )


def cluster(*workers: WorkerView, tick: int = 0, entropy: int = 0) -> ClusterView:
    named = tuple(replace(wv, url=f"w{i}") for i, wv in enumerate(workers))
    return ClusterView(workers=named, tick=tick, entropy=entropy)


def req(
    prompt_len: int = 1000,
    turn: int | None = 0,
    est_hit: int = 0,
    text: str = "",
    page_size: int = 16,
) -> RequestFeatures:
    return RequestFeatures(
        prompt_len=prompt_len,
        page_hashes=(),
        page_size=page_size,
        turn=turn,
        est_hit=est_hit,
        text=text,
    )


def assert_follow_ups_match(
    policy: Policy, reference: Policy, views: Sequence[ClusterView]
) -> None:
    """Follow-ups (turns 1 and 2, a 900-token prompt with 800 / 820 tokens of history) are decided
    on every view exactly as `reference` decides them: for the policies that change only the
    first turn."""
    for view in views:
        for turn, history in ((2, 820), (1, 800)):
            f = req(prompt_len=900, turn=turn, est_hit=history)
            assert policy.decide(f, view) == reference.decide(f, view), (policy.name, view, f)


def with_l3(view: ClusterView, l3: int | None) -> ClusterView:
    return replace(view, workers=tuple(replace(x, l3_hit=l3) for x in view.workers))


def random_cases(
    seed: int, prefill_only: bool = False
) -> list[tuple[RequestFeatures, ClusterView]]:
    """Seeded random requests and views: clusters of 2-5 workers, each request a first turn or a
    follow-up whose history some worker holds whole, in part or not at all (evicted), or one of
    unknown turn. prefill_only: PD prefill instances, their load the tokens queued there (no
    running batch, no separate unprefilled count), as the router's PD views have it."""
    rng = random.Random(seed)
    out = []
    for tick in range(300):
        history = rng.choice((0, 160, 800, 3_200))
        prompt = history + rng.choice((16, 900, 4_000))
        workers = [
            w(
                load=rng.randrange(0, 20_000) if prefill_only else rng.randrange(0, 12),
                hit=rng.choice((0, history // 4, history // 2, history)),
                running=None if prefill_only else rng.choice((None, rng.randrange(0, 8))),
                unprefilled=0 if prefill_only else rng.choice((0, rng.randrange(0, 20_000))),
                healthy=rng.random() > 0.1,
                prefill_only=prefill_only,
            )
            for _ in range(rng.randrange(2, 6))
        ]
        if not any(x.healthy for x in workers):
            workers[0] = replace(workers[0], healthy=True)
        turn = rng.choice((0, 1, 3, None)) if history else 0
        f = req(prompt_len=prompt, turn=turn, est_hit=history)
        out.append((f, replace(cluster(*workers), tick=tick, entropy=rng.getrandbits(62))))
    return out
