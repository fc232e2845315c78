"""Imports every built-in policy module so that each registers itself."""

from smetric_router.policies import (
    bailian,
    cache_aware,
    lmetric,
    lmetric_inflight,
    load_balance,
    simple,
    smetric,
    smetric_delay,
    smetric_fetch,
    smetric_ftband,
    smetric_ftcost,
    smetric_ftrecent,
    smetric_ftwork,
    smetric_inflight,
    smetric_l3move,
    smetric_paper,
)

__all__ = [
    "bailian",
    "cache_aware",
    "lmetric",
    "lmetric_inflight",
    "load_balance",
    "simple",
    "smetric",
    "smetric_delay",
    "smetric_fetch",
    "smetric_ftband",
    "smetric_ftcost",
    "smetric_ftrecent",
    "smetric_ftwork",
    "smetric_inflight",
    "smetric_l3move",
    "smetric_paper",
]
