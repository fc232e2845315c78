"""The router's file descriptors: the open-file limit it runs under and its share for workers.

Every client connection and every connection to a worker is a file descriptor. A distribution's
default soft limit (often 1024) is far below what a router with a thousand streams needs, while
the hard limit usually allows much more; so the router raises its soft limit to the hard one at
start, and keeps half of it for connections to workers unless told otherwise.
"""

from __future__ import annotations

import ctypes
import logging
import os
import resource

log = logging.getLogger(__name__)

# glibc's mallopt parameter (malloc.h). The router's threads (feature extraction, asyncio's
# getaddrinfo executor, libzmq's I/O thread) would each get a malloc arena of their own, and each
# arena keeps what it once held: benchmarks/soak.py measured router RSS 126 -> 152 MB over 200K
# requests with a worker restarted every 30 s, against 131 -> 135 MB with two arenas.
_M_ARENA_MAX = -8
ROUTER_MALLOC_ARENAS = 2

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


def limit_malloc_arenas(arenas: int = ROUTER_MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas (before threads start); False where not applied: another C
    library, or MALLOC_ARENA_MAX set by the operator (theirs wins)."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_ARENA_MAX, arenas))


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
