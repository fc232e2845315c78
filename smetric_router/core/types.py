"""The data a routing decision is made from, and the decision itself.

Invariants (see policies/NOTES.md):
- RequestFeatures are computed once per request and never mutated.
- ClusterView is an immutable snapshot; policies read it and never do I/O.
- A Decision names one worker by URL and says why it was chosen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum


class Reason(str, Enum):
    """Why SMetric chose a worker (the value of the x-smetric-reason header)."""

    FIRST_TURN_BALANCE = "first-turn-balance"
    STICKY = "sticky"
    OVERLOAD_FALLBACK = "overload-fallback"
    EVICTED_FALLBACK = "evicted-fallback"
    # The history left the local tiers but is fetchable from the global tier (L3): it stays with
    # its best local holder, which loads the rest from L3 (--l3-aware-guard, policies/NOTES.md).
    STICKY_L3 = "sticky-l3"
    # A follow-up the guards sent away from its holder went to its session's home worker (the
    # rendezvous choice of the client's session hint among the workers at or below the mean
    # load) instead of the least loaded one (policies/smetric.py, session_home.py).
    SESSION_HINT_FALLBACK = "session-hint-fallback"
    # A follow-up whose holder's circuit is open went elsewhere, as if its history were evicted
    # (smetric_router/breaker/): the holder answers /health but its requests keep failing.
    BREAKER_OPEN = "breaker-open"


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """What the router knows about one request before choosing a worker.

    turn: number of prior assistant turns (0 = first request of a session); None when the request
        carries no history the router can count (raw prompts without a hint): policies then infer it
        from the cluster view (see policies/turn.py).
    est_hit: tokens of the carried history before the newly appended turn — what a worker that
        served the previous turn should still hold.
    page_hashes: SGLang KV-event block hashes (signed int64) of the prompt's full pages.
    page_digests: their full SHA-256 chain digests, 32 bytes each, concatenated (SGLang's L3 keys
        are the hex digests); empty where the caller did not ask for them.
    text: the request's prompt text, used only by the text-tree `cache_aware` baseline.
    session_hint: the session id the client sent (an agent's session header, features/
        session_hint.py), None without one. A hint only: no policy may require it.
    """

    prompt_len: int
    page_hashes: Sequence[int]
    page_size: int
    turn: int | None
    est_hit: int
    text: str = ""
    model: str | None = None
    page_digests: bytes = b""
    session_hint: str | None = None


@dataclass(frozen=True, slots=True)
class WorkerView:
    """One worker as a policy sees it, for one request.

    hit: leading prompt tokens held in this instance's local tiers (GPU, or GPU+host where the
        host tier is enabled); gpu_hit: the GPU-tier part alone.
    l3_hit: leading prompt tokens this instance can load from the global tier (Mooncake, HiCache's
        L3), whatever it holds locally; 0 without a global tier (or with the router's L3 view
        off), None when the tier's state is unknown (master unreachable): never read as a miss.
    load: the load signal: in-flight requests under PD colocation, unprefilled tokens for PD
        prefill instances, tokens in use for PD decode instances.
    running: the requests the worker itself reports running (its running batch, without its
        waiting queue); None when unknown (no fresh report) and for PD instances, whose load
        signal is tokens, not requests.
    text_match / text_tree_size: the approximate text tree of the `cache_aware` baseline (chars).
    unprefilled: colocated workers: prompt tokens routed to this instance whose first token has
        not come back yet, each request counting its prompt minus the hit the view showed when it
        was routed (a non-streamed request counts until its answer); this router's count plus the
        syncing replicas', plus what the worker's fresh report of its waiting queue holds beyond
        them (router/workers.py). 0 for PD instances, whose load is already counted in tokens.
    recent_tokens: new prompt tokens (prompt minus the hit its view showed) routed to this worker
        lately, summed with a half-life of RECENT_HALF_LIFE_S (core/decay.py): this router's and
        the syncing replicas'. The sessions a worker was given come back to it between their
        tool calls; a count of requests in flight sees only those mid-request.
    breaker_open: the worker's circuit takes no request now (open, or half-open with its probes
        all in flight; smetric_router/breaker/), though it may pass its health checks.
    prefill_only: a PD prefill instance: its load is the prompt tokens queued there, and it hands
        each prompt's KV to a decode instance, so a request waits there for the queue ahead and
        its own prefill, and its prefill holds up no decoding.
    """

    url: str
    load: float
    hit: int = 0
    gpu_hit: int = 0
    l3_hit: int | None = 0
    healthy: bool = True
    text_match: int = 0
    text_tree_size: int = 0
    running: int | None = None
    unprefilled: int = 0
    breaker_open: bool = False
    recent_tokens: float = 0.0
    prefill_only: bool = False

    @property
    def usable(self) -> bool:
        return self.healthy and not self.breaker_open


@dataclass(frozen=True, slots=True)
class ClusterView:
    """An immutable snapshot of the cluster for one decision.

    tick: a counter the caller advances once per decision, used for round-robin tie-breaking so
        that policies stay pure.
    entropy: random bits the caller draws per decision, for the randomized baselines.
    """

    workers: tuple[WorkerView, ...]
    tick: int = 0
    entropy: int = 0

    def healthy(self) -> tuple[WorkerView, ...]:
        """The candidates: healthy workers whose circuit takes requests."""
        return tuple(w for w in self.workers if w.usable)

    def worker(self, url: str) -> WorkerView | None:
        return next((w for w in self.workers if w.url == url), None)

    def answered(self, l3: int | None) -> ClusterView:
        """The view with the global tier's answer in: l3 for every worker that uses the tier
        (those whose l3_hit is None while the answer is out), the others as they are."""
        workers = tuple(replace(w, l3_hit=l3) if w.l3_hit is None else w for w in self.workers)
        return replace(self, workers=workers)


@dataclass(frozen=True, slots=True)
class Decision:
    worker: str
    reason: str


class NoWorkerAvailable(Exception):
    """Raised by a policy when the view has no healthy worker."""
