"""Types shared by the router, the emulated worker and the simulator."""

from smetric_router.core.types import ClusterView, Decision, Reason, RequestFeatures, WorkerView

__all__ = ["ClusterView", "Decision", "Reason", "RequestFeatures", "WorkerView"]
