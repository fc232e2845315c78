"""The priority the router asks for a follow-up (SGLang's `priority` field, higher goes first in
a worker started with --enable-priority-scheduling).

Past the cluster's knee the requests wait in the workers' queues, and which of them wait decides
how many keep their TTFT: a follow-up's history is cached where it goes, so it costs its new
tokens only, while a first turn computes its whole prompt; an agent's follow-up is also a task
half done. Ordering follow-ups first in each worker's queue is what the router can do about it
without holding requests itself (admission does that, with bounds to size).

A rule of the request alone (its turn), the same in the router and the simulator.
"""

from __future__ import annotations


def follow_up_priority(turn: int, asked: int | None, setting: int) -> int | None:
    """The priority to send with a request of this turn, or None to send the body as it came:
    the client's own `priority` (`asked`) always stands, first turns get nothing, and a setting of
    0 (the default) leaves every request alone."""
    if setting == 0 or asked is not None or turn == 0:
        return None
    return setting
