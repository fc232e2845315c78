"""The router's file descriptors: the open-file limit it runs under and its share for workers.

Every client connection and every connection to a worker is a file descriptor. A distribution's
default soft limit (often 1024) is far below what a router with a thousand streams needs, while
the hard limit usually allows much more; so the router raises its soft limit to the hard one at
start, and keeps half of it for connections to workers unless told otherwise.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger(__name__)

# --max-upstream-connections 0 (auto): half the open-file limit, within these bounds.
AUTO_MIN, AUTO_MAX = 64, 16384


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == hard:
        log.info("open-file limit %d (hard limit %s)", soft, _show(hard))
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as e:
        log.warning("open-file limit stays %d: raising it to %d failed: %s", soft, hard, e)
        return soft
    log.info("open-file limit raised from %d to the hard limit %d", soft, hard)
    return hard


def upstream_connection_limit(configured: int) -> int:
    """configured > 0 as given; 0: half the current soft open-file limit, bounded."""
    if configured > 0:
        return configured
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return AUTO_MAX
    return max(AUTO_MIN, min(AUTO_MAX, soft // 2))


def _show(limit: int) -> str:
    return "unlimited" if limit == resource.RLIM_INFINITY else str(limit)
