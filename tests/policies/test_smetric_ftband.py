"""smetric-ftband: first turns by recompute cost among the workers within a band of load;
against smetric-ftcost (the cost among all) and smetric (least load). Follow-ups are smetric's
(built views). Where the band holds every worker its first turn is smetric-ftcost's, checked by
test_smetric_ftcost.py's tests parametrized over both, its follow-ups too."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from smetric_router.core.types import ClusterView
from smetric_router.policies import PolicyParams, make_policy
from tests.policies.builders import cluster, req, w

FTBAND = make_policy("smetric-ftband")
FTCOST = make_policy("smetric-ftcost")
SMETRIC = make_policy("smetric-inflight")


def test_a_holder_beyond_the_band_is_passed_over_however_cheap() -> None:
    # w0 holds all but 100 tokens: 100 x 3 = 300 against 8,000, but 2 + 1 > 2 x (0 + 1)
    view = cluster(w(load=2, hit=7_900), w(load=0))
    assert FTBAND.decide(req(prompt_len=8_000, turn=0), view).worker == "w1"
    assert FTCOST.decide(req(prompt_len=8_000, turn=0), view).worker == "w0"
    # the band is --move-cost-ratio's: at 4 the same holder is inside it
    wide = make_policy("smetric-ftband", PolicyParams(move_cost_ratio=4))
    assert wide.decide(req(prompt_len=8_000, turn=0), view).worker == "w0"


def test_the_band_is_relative_to_the_least_load() -> None:
    # under load the same holder may be twice as busy: 7 + 1 <= 2 x (3 + 1), not 8 + 1
    view = cluster(w(load=7, hit=7_900), w(load=3))
    assert FTBAND.decide(req(prompt_len=8_000, turn=0), view).worker == "w0"
    view = cluster(w(load=8, hit=7_900), w(load=3))
    assert FTBAND.decide(req(prompt_len=8_000, turn=0), view).worker == "w1"


def _burst(policy_name: str, sessions: int, workers: int) -> Counter[str]:
    """First turns of `sessions` sessions sharing a 900-token template of their 1,000-token
    prompt, each arriving while the earlier ones are still in flight on idle workers; the chosen
    worker holds the template from then on."""
    policy = make_policy(policy_name)
    view: ClusterView = cluster(*[w(load=0) for _ in range(workers)])
    placed: Counter[str] = Counter()
    for tick in range(sessions):
        chosen = policy.decide(req(prompt_len=1_000, turn=0), replace(view, tick=tick)).worker
        placed[chosen] += 1
        view = replace(view, workers=tuple(
            replace(x, load=x.load + 1, hit=900, gpu_hit=900) if x.url == chosen else x
            for x in view.workers))  # fmt: skip
    return placed


def test_a_burst_of_sessions_on_one_template_stays_balanced() -> None:
    # the band spreads them two by two; the cost alone piles them all on the first holder
    assert sorted(_burst("smetric-ftband", 8, 4).values()) == [2, 2, 2, 2]
    assert _burst("smetric-ftcost", 8, 4).most_common(1)[0][1] == 8
    assert sorted(_burst("smetric-inflight", 8, 4).values()) == [2, 2, 2, 2]
