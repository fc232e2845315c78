"""The simulated tiers' costs: per-server links, write-through, and the two tier modes' fetches.

Every instance reaches the shared GlobalTier through its own TierPort, which supplies the time
(the Engine has no clock) and charges the instance's server link:

- Links: one FIFO per server at nics_per_server x nic_bytes_per_s. It carries the network part
  (SimConfig.net_fraction) of the server's global-tier reads and of its writes. Reads arrive on
  a NIC and writes leave it, so a full-duplex NIC carries them in opposite directions; but pages
  are spread evenly over the servers, so each server also sends the pages others read from it
  and receives the pages others write to it, about as many bytes as it reads and writes itself.
  Either direction then carries about reads + writes, and one FIFO with both models the busier.
- Write-through: the pages an engine adds to its radix tree (computed, or brought from another
  tier) that the global tier lacks are sent from the start of the step that makes them (stores
  stream out layer by layer) and become readable when both their transfer and the step have
  ended (GlobalTier ready times). Every transfer is queued at the current event time, never at
  a future one: a FIFO fed a future reservation would make earlier traffic wait behind it.
- paper mode (LMCache, synchronous loading): a fetch at admission costs fetch_overhead_s, the
  link transfer of its network bytes (queued behind the server's other transfers) and PCIe
  host -> GPU for all its bytes; the step the request is admitted in lasts that much longer.
- hicache mode (SGLang HiCache): the L3 prefetch starts when the request is queued: its network
  bytes queue on the link, pages completing at a steady rate, fetch_overhead_s later, and
  at the request's admission it takes what the prefetch policy allows (HiCachePrefetch). The
  fetched pages then cross PCIe host -> GPU in the admitting step, like L2 host hits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from smetric_router.engine.api import EngineConfig
from smetric_router.engine.engine import Engine
from smetric_router.engine.global_tier import GlobalTier
from smetric_router.engine.timing import TimingModel
from smetric_router.sim.config import SimConfig

# SGLang 0.5.23 HiCache L3 prefetch (python/sglang/srt/...):
# - mem_cache/hybrid_cache/hybrid_cache_controller.py parse_storage_backend_extra_config:
#   prefetch_threshold 256 tokens, prefetch_timeout_base 1 s, prefetch_timeout_per_ki_token 0.25 s;
# - mem_cache/unified_cache/storage_attachment.py: per page = page_size / 1024 x per_ki_token;
# - mem_cache/unified_radix_cache.py _start_storage_prefetch_wait: the timeout clock starts at the
#   first admission poll that finds the prefetch unfinished; timeout = base + pages x per page;
#   prefetches shorter than prefetch_threshold are not started;
# - managers/scheduler.py: a request whose prefetch may not stop yet is skipped ("continue").
PREFETCH_THRESHOLD_TOKENS = 256
PREFETCH_TIMEOUT_BASE_S = 1.0
PREFETCH_TIMEOUT_PER_KI_TOKEN_S = 0.25


def prefetch_timeout_s(tokens: int) -> float:
    """SGLang's timeout for a prefetch of `tokens` (from the first blocked admission poll)."""
    return PREFETCH_TIMEOUT_BASE_S + PREFETCH_TIMEOUT_PER_KI_TOKEN_S * tokens / 1024


def prefetch_wake(prefetch: HiCachePrefetch | None, t: float, instance: int) -> float:
    """When an instance whose every waiting request waits on its prefetch wakes up: when the
    first may stop (an arrival wakes it earlier)."""
    wake = prefetch.next_ready(t) if prefetch is not None else math.inf
    if math.isinf(wake):  # cannot happen: a request with nothing to wait for is admitted
        raise RuntimeError(f"instance {instance} has work it can neither run nor wait for")
    return wake


class Link:
    """A server's NICs: one FIFO for its global-tier reads' and writes' network bytes."""

    __slots__ = ("busy_s", "bytes_per_s", "free_at")

    def __init__(self, bytes_per_s: float) -> None:
        self.bytes_per_s = bytes_per_s
        self.free_at = 0.0
        self.busy_s = 0.0

    def transfer(self, t: float, nbytes: float) -> tuple[float, float]:
        """Queue nbytes at t: (start, end) of its transfer."""
        start = t if t > self.free_at else self.free_at
        seconds = nbytes / self.bytes_per_s
        self.free_at = start + seconds
        self.busy_s += seconds
        return start, self.free_at

    def cancel_tail(self, end: float, at: float) -> None:
        """The transfer ending at `end` stops at `at`: give the link back if nothing queued
        behind it."""
        if self.free_at == end and at < end:
            self.busy_s -= end - at
            self.free_at = at


@dataclass(slots=True)
class TierStats:
    """Bytes moved to and from the global tier (whole pages, network and local parts)."""

    fetch_bytes: float = 0.0
    write_bytes: float = 0.0


class TierPort:
    """One instance's view of the shared GlobalTier (engine.global_tier.KvTier): reads at `now`,
    writes buffered during a step and sent by flush() once the step's length is known."""

    __slots__ = ("_pending", "link", "net_fraction", "now", "page_bytes", "stats", "tier")

    def __init__(
        self, tier: GlobalTier, link: Link, page_bytes: float, net_fraction: float, stats: TierStats
    ) -> None:
        self.tier = tier
        self.link = link
        self.page_bytes = page_bytes
        self.net_fraction = net_fraction
        self.stats = stats
        self.now = 0.0  # the instance's time: set by the simulator before it calls the engine
        self._pending: list[int] = []

    def peek(self, page_hashes: Sequence[int]) -> int:
        return self.tier.peek(page_hashes, self.now)

    def lookup(self, page_hashes: Sequence[int]) -> int:
        return self.tier.lookup(page_hashes, self.now)

    def store(self, page_hashes: Sequence[int]) -> None:
        self._pending.extend(page_hashes)

    def flush(self, start: float, end: float) -> None:
        """The step [start, end) made the pending pages: send the new ones through from its start;
        they are readable once sent and the step is over."""
        if not self._pending:
            return
        new = self.tier.missing(self._pending)
        self._pending.clear()
        if not new:
            return
        nbytes = len(new) * self.page_bytes
        self.stats.write_bytes += nbytes
        sent = (
            self.link.transfer(start, nbytes * self.net_fraction)[1] if self.net_fraction else 0.0
        )
        self.tier.store(new, max(sent, end))


class HiCachePrefetch:
    """One instance's L3 prefetches (engine.engine.Prefetcher) on its server link.

    A prefetch of n pages queued at t transfers from t + overhead behind the link's other work;
    its pages complete evenly over the transfer. At an admission poll at time x the request
    takes what arrived by x (best_effort), waits for all (wait_complete), or waits until all
    arrived or SGLang's timeout ran out from its first blocked poll (timeout).
    """

    __slots__ = ("_ops", "kv_page_bytes", "overhead_s", "page_size", "policy", "port")

    def __init__(self, port: TierPort, policy: str, overhead_s: float, page_size: int) -> None:
        self.port = port
        self.policy = policy
        self.overhead_s = overhead_s
        self.page_size = page_size
        # rid -> [pages, first page due, last page due, deadline (inf until the first poll),
        #         end of its link transfer]
        self._ops: dict[str, list[float]] = {}

    def start(self, rid: str, pages: int) -> None:
        if pages * self.page_size < PREFETCH_THRESHOLD_TOKENS:
            return
        port = self.port
        t = port.now
        nbytes = pages * port.page_bytes * port.net_fraction
        start, end = port.link.transfer(t, nbytes) if nbytes else (t, t)
        # the lookup's fixed cost delays the pages, not the link (queued now, in event order)
        lag = self.overhead_s
        self._ops[rid] = [float(pages), start + lag, end + lag, math.inf, end]

    def _arrived(self, op: list[float], x: float) -> int:
        pages, start, end = int(op[0]), op[1], op[2]
        if x >= end:
            return pages
        if x <= start:
            return 0
        return int(pages * (x - start) / (end - start))

    def poll(self, rid: str) -> int | None:
        op = self._ops.get(rid)
        if op is None:
            return 0
        x = self.port.now
        if self.policy != "best_effort" and x < op[2]:
            if self.policy == "wait_complete":
                return None
            if op[3] == math.inf:
                op[3] = x + prefetch_timeout_s(int(op[0]) * self.page_size)
            if x < op[3]:
                return None
        del self._ops[rid]
        got = self._arrived(op, x)
        if x < op[2]:
            self.port.link.cancel_tail(op[4], min(op[4], max(x - self.overhead_s, op[1])))
        self.port.stats.fetch_bytes += got * self.port.page_bytes
        return got

    def next_ready(self, t: float) -> float:
        """The earliest time after t at which a waiting prefetch may stop (inf: none waits)."""
        best = math.inf
        for op in self._ops.values():
            ready = op[2] if self.policy == "wait_complete" else min(op[2], op[3])
            if t < ready < best:
                best = ready
        return best


class Tiers:
    """The engines' config, the shared global tier, the server links and every instance's port:
    what the colocated (sim/cluster.py) and PD (sim/pd.py) clusters share."""

    def __init__(self, cfg: SimConfig, timing: TimingModel, global_ratio: float) -> None:
        self.cfg = cfg
        self.timing = timing
        self.engine_config, self.tier = engine_setup(cfg, timing, global_ratio)
        self.links = [Link(cfg.server_link_bytes_per_s) for _ in range(cfg.servers)]
        self.stats = TierStats()
        self.ports: list[TierPort] = []
        self.prefetchers: list[HiCachePrefetch] = []

    def engine(self, idx: int) -> Engine:
        """Instance idx's engine, wired to its server's link."""
        cfg, timing = self.cfg, self.timing
        if self.tier is None:
            return Engine(self.engine_config, None, timing)
        page_bytes = float(cfg.page_size * timing.kv_bytes_per_token)
        port = TierPort(
            self.tier,
            self.links[idx // cfg.gpus_per_server],
            page_bytes,
            cfg.net_fraction,
            self.stats,
        )
        eng = Engine(self.engine_config, port, timing)
        self.ports.append(port)
        if cfg.tier_mode == "hicache":
            pf = HiCachePrefetch(port, cfg.prefetch_policy, cfg.fetch_overhead_s, cfg.page_size)
            eng.prefetcher = pf
            self.prefetchers.append(pf)
            eng.storage_fetch_seconds = timing.host_load_seconds  # L3 -> host happened already
        else:
            eng.storage_fetch_seconds = self._stall(port)
        return eng

    def _stall(self, port: TierPort) -> Callable[[int], float]:
        """paper mode: the seconds a fetch of `tokens` adds to the admitting step."""
        kv_bytes = self.timing.kv_bytes_per_token
        pcie = self.timing.host_load_seconds
        overhead = self.cfg.fetch_overhead_s
        stats = self.stats

        def fetch(tokens: int) -> float:
            nbytes = tokens * kv_bytes
            stats.fetch_bytes += nbytes
            t = port.now
            end = t
            if port.net_fraction:
                end = port.link.transfer(t, nbytes * port.net_fraction)[1]
            return overhead + end - t + pcie(tokens)

        return fetch

    def port(self, idx: int) -> TierPort | None:
        return self.ports[idx] if self.ports else None

    def prefetcher(self, idx: int) -> HiCachePrefetch | None:
        return self.prefetchers[idx] if self.prefetchers else None

    def link_busy_share(self, span: float) -> float:
        """Mean over servers of the share of [0, span] its link was busy."""
        if span <= 0 or not self.links:
            return 0.0
        return sum(min(link.busy_s / span, 1.0) for link in self.links) / len(self.links)


def engine_setup(
    cfg: SimConfig, timing: TimingModel, global_ratio: float
) -> tuple[EngineConfig, GlobalTier | None]:
    """Every instance's engine config and the global tier they share (colocated and PD runs).

    paper mode has no private host tier; both modes size the global tier at global_ratio x the
    instances' total GPU KV (0 means none).
    """
    gpu = cfg.gpu_kv_tokens if cfg.gpu_kv_tokens is not None else timing.gpu_kv_tokens
    host = cfg.host_kv_tokens if cfg.host_kv_tokens is not None else timing.host_kv_tokens
    if cfg.tier_mode == "paper":
        host = 0
    ecfg = EngineConfig(
        page_size=cfg.page_size,
        gpu_kv_tokens=gpu,
        host_kv_tokens=host,
        chunked_prefill_size=cfg.chunked_prefill_size,
        max_running_requests=cfg.max_running_requests,
        profile=cfg.profile,
        enable_priority_scheduling=cfg.follow_up_priority != 0,
    )
    if global_ratio <= 0:
        return ecfg, None
    capacity = global_ratio * cfg.instances * gpu
    return ecfg, GlobalTier(capacity if not math.isnan(capacity) else math.inf, cfg.page_size)
