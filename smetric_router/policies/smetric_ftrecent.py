"""smetric-ftrecent: SMetric with a session's first request placed where the least new work was
sent lately.

`smetric-inflight` sends a first turn to the worker with the fewest requests in flight; this policy
sends it to the worker with the fewest recent tokens (WorkerView.recent_tokens: the new prompt
tokens routed there, summed with a five-minute half-life), ties to the fewest in flight, then
round-robin (or the session's home, with a session hint). Follow-ups are `smetric-inflight`'s.

Why: an agent's session is mostly between requests (tool calls, the user), and each of its
follow-ups comes back to the worker that holds its history. The requests in flight show only the
sessions that are mid-request; the tokens sent lately show the sessions a worker holds, and so
the follow-ups coming to it. It is sglang-router's `cache_aware` rule for a prompt it has no
match for (the worker whose text tree is smallest), as a sum that forgets: a tree grows to its
size bound, after which every worker ties."""

from __future__ import annotations

from smetric_router.core.types import RequestFeatures, WorkerView
from smetric_router.policies.base import PolicyParams, register
from smetric_router.policies.smetric import SMetric


def recent_tokens(worker: WorkerView, features: RequestFeatures) -> float:
    return worker.recent_tokens


@register("smetric-ftrecent")
def _make(params: PolicyParams) -> SMetric:
    return SMetric(params, name="smetric-ftrecent", first_key=recent_tokens)
