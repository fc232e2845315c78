from __future__ import annotations

import pytest

from smetric_router.core.types import NoWorkerAvailable
from smetric_router.policies import make_policy
from tests.policies.builders import cluster, req, w


def test_least_tokens_picks_the_decode_instance_with_fewest_tokens_in_use() -> None:
    policy = make_policy("least_tokens")
    # Hits do not matter at decode: the KV comes from the prefill instance.
    d = policy.decide(req(turn=2, est_hit=900), cluster(w(9000, 900), w(1200), w(30000)))
    assert (d.worker, d.reason) == ("w1", "least_tokens")
    # An unhealthy instance is never chosen, however idle; ties go round-robin by tick.
    view = cluster(w(0, healthy=False), w(500), w(500), tick=1)
    assert policy.decide(req(), view).worker == "w2"
    with pytest.raises(NoWorkerAvailable):
        policy.decide(req(), cluster(w(0, healthy=False)))
