"""A policy wrapper for the simulator's tests: what the simulator shows a policy is what the
router would, so the tests read the views it was asked to decide on."""

from __future__ import annotations

from smetric_router.core.types import ClusterView, Decision, RequestFeatures
from smetric_router.policies import Policy


class ViewRecorder:
    """Decides as `inner` and keeps every view it was shown, in order."""

    uses_text_tree = False

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.views: list[ClusterView] = []

    def needs_l3(self, features: RequestFeatures, view: ClusterView) -> bool:
        return self.inner.needs_l3(features, view)

    def decide(self, features: RequestFeatures, view: ClusterView) -> Decision:
        self.views.append(view)
        return self.inner.decide(features, view)
