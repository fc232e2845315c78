"""Routing policies: one small pure function of (features, view) per file."""

from smetric_router.policies.base import Policy, PolicyParams, make_policy, policy_names

__all__ = ["Policy", "PolicyParams", "make_policy", "policy_names"]
