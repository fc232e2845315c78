"""The engine model: paged radix cache + continuous-batching scheduler + step-time model.

Scheduling, per step (one forward):
1. Requests already admitted and still prefilling continue FCFS, each taking what it can of the
   chunked_prefill_size budget of new prompt tokens.
2. While budget is left and running < max_running_requests, the head of the waiting queue is
   admitted (strict FCFS: if it does not fit, nobody behind it is admitted this step; with
   priority scheduling the queue is in priority order, then arrival, as SGLang sorts it). Its
   prefix is matched (device, then host, then the global tier), host/global pages are loaded to
   the GPU, and it gets its first chunk. With a Prefetcher (SGLang HiCache's L3 prefetch), a
   request whose prefetch may not stop yet is passed over and the next one is tried, as SGLang's
   scheduler does; its global-tier hit is what the prefetch brought, not what the tier holds.
3. Every request whose prefill finished in an earlier step decodes one token in the same forward
   (SGLang's --enable-mixed-chunk; without it SGLang alternates prefill and decode batches). The
   mixed form keeps decode moving under a steady stream of prefills, which is what a router sees.
A request emits its first output token in the step its prefill completes.

KV accounting: on admission a request reserves every page it will ever need (prompt + output,
minus the GPU pages it shares), evicting LRU cache to make room. Outputs are known up front, so
this is exact; it means no retraction is ever needed and the scheduler cannot deadlock. A request
that could not fit even in an empty cache is dropped (finished with no output), as SGLang rejects
prompts longer than its pool.

As in SGLang, at least the last prompt token is always computed (its logits give the first output
token), so a full cache hit is capped at len(input_ids) - 1, page-aligned.

Token-free requests (EngineRequest.page_hashes, used by the simulator) carry lengths and page
hashes instead of tokens; the cache then holds no token ids and KV events carry none.

Fast-forward (step_many): while no request prefills and none can be admitted, every step is pure
decode with a constant batch until the next request finishes, and its time is affine in the KV
length (timing.decode_run_seconds), so a run of such steps is applied in one call.
"""

from __future__ import annotations

import math
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from smetric_router.core.kv_events import KVCacheEvent
from smetric_router.engine.api import (
    CachedTokens,
    EngineConfig,
    EngineRequest,
    LoadSnapshot,
    StepResult,
)
from smetric_router.engine.global_tier import KvTier
from smetric_router.engine.radix import PageNode, RadixCache
from smetric_router.engine.timing import TimingModel
from smetric_router.features.hashing import ChainState, block_hash, page_digests

_THROUGHPUT_WINDOW = 32  # steps averaged for gen_throughput


@dataclass(frozen=True, slots=True)
class _DecodeRun:
    """k pure-decode steps of n requests from kv KV tokens (an entry of the throughput window)."""

    n: int
    kv: int
    k: int


class Prefetcher(Protocol):
    """Global-tier prefetch while a request waits (SGLang HiCache); the simulator's
    sim.tiers.HiCachePrefetch runs it on a virtual clock."""

    def start(self, rid: str, pages: int) -> None:
        """The request was queued with `pages` leading pages in the global tier beyond its local
        hit: begin fetching them (or not, below the prefetch threshold)."""
        ...

    def poll(self, rid: str) -> int | None:
        """At an admission attempt: the pages fetched if the request may be admitted now (its
        prefetch stops there), None if it must keep waiting."""
        ...


@dataclass(slots=True)
class _Req:
    req: EngineRequest
    n_in: int
    n_out: int
    hashes: list[int]  # block hashes of the prompt's full pages
    chain: ChainState | None  # hash chain after the prompt, to extend over the output at finish
    uncached_at_arrival: int
    done: int = 0  # prompt tokens whose KV exists (cached or computed)
    tree_pages: int = 0  # leading pages of the sequence held in the radix tree
    node: PageNode | None = None  # deepest of those pages (locked)
    reserved: int = 0  # pages reserved and not yet in the tree
    emitted: int = 0
    admitted: bool = False
    prefilled: bool = False  # PD decode: the prompt's KV arrives from a prefill instance
    l3_base: int = 0  # local pages when its prefetch started (the fetched pages follow them)
    l3_pages: int = -1  # pages its prefetch brought (-1: no Prefetcher: read the tier directly)
    priority: int = 0  # with priority scheduling: the queue's order, higher first

    @property
    def prefilling(self) -> bool:
        return self.done < self.n_in


class Engine:
    def __init__(
        self,
        config: EngineConfig,
        global_tier: KvTier | None = None,
        timing: TimingModel | None = None,
    ) -> None:
        self.config = config
        self.timing = timing if timing is not None else TimingModel.load(config.profile)
        self.global_tier = global_tier
        ps = config.page_size
        self.cache = RadixCache(ps, config.gpu_kv_tokens // ps, config.host_kv_tokens // ps)
        self._waiting: deque[_Req] = deque()
        self._running: list[_Req] = []
        self._by_rid: dict[str, _Req] = {}
        self._reserved = 0
        self._events: list[KVCacheEvent] = []
        self._prompt_tokens = 0
        self._cached_tokens = 0
        self._uncached_total = 0
        # (seconds, tokens) per step, or a whole decode run; each entry is at least one step
        self._recent: deque[tuple[float, int] | _DecodeRun] = deque(maxlen=_THROUGHPUT_WINDOW)
        # set when the queue head did not fit; cleared when a request releases its pages
        self._admission_blocked = False
        # global tier -> GPU seconds for a number of tokens; the simulator swaps in a shared link
        self.storage_fetch_seconds: Callable[[int], float] = self.timing.storage_fetch_seconds
        # set by the simulator's HiCache mode: the global tier is read through a prefetch
        self.prefetcher: Prefetcher | None = None
        # SGLang gives a request without a priority the lowest there is, unless told a default
        dv = config.default_priority_value
        self._default_priority = dv if dv is not None else -sys.maxsize - 1

    # ---- requests -----------------------------------------------------------------------------

    def add_request(self, req: EngineRequest) -> None:
        if req.rid in self._by_rid:
            raise ValueError(f"duplicate request id {req.rid}")
        ps = self.config.page_size
        chain: ChainState | None = None
        if req.page_hashes is None:
            n_in, n_out = len(req.input_ids), len(req.output_ids)
            digests = page_digests(req.input_ids, ps)
            n_full = len(digests) * ps
            chain = ChainState(
                ps, digests[-1] if digests else b"", tuple(req.input_ids[n_full:]), len(digests)
            )
            hashes = [block_hash(d) for d in digests]
        else:
            n_in, n_out = req.input_len, req.output_len
            if len(req.page_hashes) != (n_in + n_out) // ps:
                raise ValueError(
                    f"request {req.rid}: {len(req.page_hashes)} page hashes for "
                    f"{n_in + n_out} tokens of pages of {ps}"
                )
            hashes = req.page_hashes[: n_in // ps]
        if n_in <= 0:
            raise ValueError(f"request {req.rid} has an empty prompt")
        cacheable = hashes[: (n_in - 1) // ps]
        gpu, host = self.cache.match_len(cacheable)
        r = _Req(req, n_in, n_out, hashes, chain, n_in - gpu * ps)
        self._enqueue(r)
        self._by_rid[req.rid] = r
        if self.prefetcher is not None and self.global_tier is not None:
            r.l3_base = gpu + host
            self.prefetcher.start(req.rid, self.global_tier.peek(cacheable[gpu + host :]))

    def _enqueue(self, r: _Req) -> None:
        waiting = self._waiting
        if not self.config.enable_priority_scheduling:
            waiting.append(r)
            return
        # behind every request of its priority or higher: arrival order within a priority
        p = r.req.priority if r.req.priority is not None else self._default_priority
        r.priority = p
        i = len(waiting)
        while i > 0 and waiting[i - 1].priority < p:
            i -= 1
        waiting.insert(i, r)
        if i == 0:
            # the head that did not fit is no longer the head: the new one may fit
            self._admission_blocked = False

    def add_prefilled_request(self, req: EngineRequest) -> None:
        """PD decode: the prompt's KV was transferred from a prefill instance, so on admission the
        whole prompt is present on the GPU (nothing computed or loaded) and the first output token,
        which came with the KV, is emitted in the admitting step."""
        self.add_request(req)
        r = self._by_rid[req.rid]
        r.prefilled = True
        r.uncached_at_arrival = 0

    def abort(self, rid: str) -> None:
        r = self._by_rid.pop(rid, None)
        if r is None:
            return
        if r.admitted:
            self._running.remove(r)
            self._release(r)
        else:
            self._waiting.remove(r)

    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    @property
    def num_running_reqs(self) -> int:
        """The running batch (admitted, not finished), as /v1/loads reports it."""
        return len(self._running)

    @property
    def prefill_tokens_computed(self) -> int:
        """Prompt tokens computed so far (not served from any cache tier)."""
        return self._uncached_total

    # ---- one step -----------------------------------------------------------------------------

    def step(self) -> StepResult:
        cfg = self.config
        result = StepResult(duration=0.0)
        events = result.kv_events
        events.extend(self._events)
        self._events = []
        budget = cfg.chunked_prefill_size
        chunks: list[tuple[_Req, int]] = []
        decoding = [r for r in self._running if not r.prefilling]
        for r in self._running:
            if budget <= 0:
                break
            if r.prefilling:
                q = min(r.n_in - r.done, budget)
                chunks.append((r, q))
                budget -= q
        load_s = 0.0
        waiting, prefetcher = self._waiting, self.prefetcher
        i = 0  # the first request not passed over (always 0 without a Prefetcher)
        while (
            budget > 0
            and i < len(waiting)
            and not self._admission_blocked
            and len(self._running) < cfg.max_running_requests
        ):
            r = waiting[i]
            if prefetcher is not None and r.l3_pages < 0 and not r.prefilled:
                fetched = prefetcher.poll(r.req.rid)
                if fetched is None:  # still prefetching: SGLang tries the next request
                    i += 1
                    continue
                r.l3_pages = fetched
            seconds = self._admit(r, result)
            if seconds is None:
                break
            del waiting[i]
            if not r.admitted:  # could never fit: dropped
                continue
            load_s += seconds
            q = min(r.n_in - r.done, budget)
            chunks.append((r, q))
            budget -= q
        if not chunks and not decoding:
            return result

        kv_tokens = sum(r.n_in + r.emitted for r in decoding)
        prefill = [(r.done, q) for r, q in chunks]
        result.duration = self.timing.step_seconds(prefill, len(decoding), kv_tokens) + load_s

        finished: list[_Req] = []
        for r, q in chunks:
            r.done += q
            self._uncached_total += q
            self._cache_pages(r, r.hashes, r.done // cfg.page_size, events)
            if not r.prefilling:
                self._emit(r, result, finished)
        for r in decoding:
            self._emit(r, result, finished)
        for r in finished:
            self._finish(r, events)
            result.finished.append(r.req.rid)
        emitted = sum(n for _, n in result.emitted)
        self._recent.append((result.duration, emitted))
        return result

    def _emit(self, r: _Req, result: StepResult, finished: list[_Req]) -> None:
        if r.emitted < r.n_out:
            r.emitted += 1
            result.emitted.append((r.req.rid, 1))
        if r.emitted >= r.n_out:
            finished.append(r)

    # ---- fast-forward -------------------------------------------------------------------------

    def decode_only_steps(self) -> int:
        """How many next steps are pure decode with the same batch and nobody finishing (0 when
        the next step prefills, admits, or finishes a request)."""
        if not self._running or (
            self._waiting
            and not self._admission_blocked
            and len(self._running) < self.config.max_running_requests
        ):
            return 0
        left = math.inf
        for r in self._running:
            if r.done < r.n_in:
                return 0
            left = min(left, r.n_out - r.emitted)
        return max(int(left) - 1, 0)

    def decode_run_seconds(self, k: int) -> float:
        """Model time of the next k steps, for k <= decode_only_steps()."""
        n = len(self._running)
        kv = sum(r.n_in + r.emitted for r in self._running)
        return self.timing.decode_run_seconds(n, kv, k)

    def step_many(self, max_steps: int, until_seconds: float = math.inf) -> StepResult:
        """Up to max_steps pure-decode steps at once, stopping after the first one that ends at or
        beyond until_seconds from now; the same state, durations and tokens as that many step()
        calls. When the next step is not pure decode, this is step()."""
        k = min(max_steps, self.decode_only_steps())
        if k <= 0:
            return self.step()
        n = len(self._running)
        kv = sum(r.n_in + r.emitted for r in self._running)
        timing = self.timing
        if until_seconds < timing.decode_run_seconds(n, kv, k):
            k = timing.decode_steps_to_reach(n, kv, until_seconds, k)
        result = StepResult(duration=timing.decode_run_seconds(n, kv, k), steps=k)
        result.kv_events.extend(self._events)
        self._events = []
        for r in self._running:
            r.emitted += k
            result.emitted.append((r.req.rid, k))
        self._recent.append(_DecodeRun(n, kv, k))
        return result

    def _throughput_window(self) -> list[tuple[float, int]]:
        """(seconds, tokens) of the last _THROUGHPUT_WINDOW steps, oldest first. Decode runs are
        expanded into their steps only here: only load() reads the window, and the simulator
        never calls it."""
        steps: list[tuple[float, int]] = []  # newest first
        for entry in reversed(self._recent):
            if isinstance(entry, _DecodeRun):
                n, kv, k = entry.n, entry.kv, entry.k
                take = min(k, _THROUGHPUT_WINDOW - len(steps))
                for j in range(k - 1, k - take - 1, -1):
                    steps.append((self.timing.step_seconds((), n, kv + j * n), n))
            else:
                steps.append(entry)
            if len(steps) >= _THROUGHPUT_WINDOW:
                break
        steps.reverse()
        return steps

    def _admit(self, r: _Req, result: StepResult) -> float | None:
        """Admit r if its pages fit, evicting cache as needed: the seconds its cache loads take,
        or None if it must wait."""
        cfg, cache = self.config, self.cache
        ps = cfg.page_size
        n_in, n_out = r.n_in, r.n_out
        cacheable = r.hashes[: (n_in - 1) // ps]
        n_gpu, n_host = cache.match_len(cacheable)
        if r.prefilled:
            n_host = 0  # the transferred KV lands on the GPU: nothing to load
        n_storage = 0
        if self.global_tier is not None and not r.prefilled:
            if r.l3_pages < 0:
                n_storage = self.global_tier.peek(cacheable[n_gpu + n_host :])
            elif n_gpu + n_host >= r.l3_base:  # the prefetched pages follow the local hit
                end = min(r.l3_base + r.l3_pages, len(cacheable))
                n_storage = max(0, end - n_gpu - n_host)
        need = -(-(n_in + n_out) // ps) - n_gpu
        deepest = cache.nodes[cacheable[n_gpu - 1]] if n_gpu else None
        cache.lock(deepest)
        free = cache.gpu_capacity - cache.gpu_used - self._reserved
        if need > free:
            result.kv_events.extend(cache.evict_gpu(need - free))
            free = cache.gpu_capacity - cache.gpu_used - self._reserved
        if need > free:
            cache.unlock(deepest)
            if self._running:
                self._admission_blocked = True
                return None
            # nothing running and the cache is as empty as it gets: it can never fit
            self._by_rid.pop(r.req.rid, None)
            result.finished.append(r.req.rid)
            return 0.0
        if self.global_tier is not None and n_storage:
            self.global_tier.lookup(cacheable[n_gpu + n_host :][:n_storage])
        cache.touch(deepest)
        r.admitted = True
        r.node = deepest
        r.tree_pages = n_gpu
        r.reserved = need
        self._reserved += need
        hit = n_gpu + n_host + n_storage
        self._cache_pages(r, r.hashes, hit, result.kv_events)
        r.done = hit * ps
        if r.prefilled:
            self._cache_pages(r, r.hashes, len(r.hashes), result.kv_events)
            r.done = n_in
        self._running.append(r)
        cached = CachedTokens(n_gpu * ps, n_host * ps, n_storage * ps)
        result.scheduled.append((r.req.rid, cached))
        self._prompt_tokens += n_in
        self._cached_tokens += cached.total
        t = self.timing
        fetch = self.storage_fetch_seconds(cached.storage) if cached.storage else 0.0
        return t.host_load_seconds(cached.host) + fetch

    def _cache_pages(
        self, r: _Req, hashes: list[int], upto: int, events: list[KVCacheEvent]
    ) -> None:
        """Put the request's pages [tree_pages, upto) into the tree, moving them off its
        reservation, and write them through to the global tier."""
        start = r.tree_pages
        if upto <= start:
            return
        tokens = (
            r.req.input_ids
            if upto * self.config.page_size <= len(r.req.input_ids)
            else [*r.req.input_ids, *r.req.output_ids]
        )  # empty for token-free requests: their pages hold no token ids
        node, _, evs = self.cache.insert(hashes, tokens, start, upto)
        events.extend(evs)
        self.cache.lock(node)
        self.cache.unlock(r.node)
        r.node = node
        moved = upto - start
        r.reserved -= moved
        self._reserved -= moved
        r.tree_pages = upto
        if self.global_tier is not None:
            self.global_tier.store(hashes[start:upto])

    def _finish(self, r: _Req, events: list[KVCacheEvent]) -> None:
        if r.chain is not None:
            hashes = r.hashes + r.chain.extend(r.req.output_ids)[1]
        else:
            hashes = r.req.page_hashes or []
        self._cache_pages(r, hashes, len(hashes), events)
        self._running.remove(r)
        self._by_rid.pop(r.req.rid, None)
        self._release(r)

    def _release(self, r: _Req) -> None:
        self._admission_blocked = False
        self._reserved -= r.reserved
        r.reserved = 0
        self.cache.unlock(r.node)
        r.node = None

    # ---- cache queries and control ------------------------------------------------------------

    def match_prefix(self, token_ids: list[int]) -> CachedTokens:
        ps = self.config.page_size
        hashes = [block_hash(d) for d in page_digests(token_ids, ps)]
        gpu, host = self.cache.match(hashes)
        storage = 0
        if self.global_tier is not None:
            storage = self.global_tier.peek(hashes[len(gpu) + len(host) :])
        return CachedTokens(len(gpu) * ps, len(host) * ps, storage * ps)

    def flush(self) -> bool:
        if self.has_work():
            return False
        self._events.extend(self.cache.clear())
        return True

    def drain_events(self) -> list[KVCacheEvent]:
        events, self._events = self._events, []
        return events

    def load(self) -> LoadSnapshot:
        ps = self.config.page_size
        used = sum(r.done + r.emitted for r in self._running)
        total = self.cache.gpu_capacity * ps
        window = self._throughput_window()
        seconds = sum(d for d, _ in window)
        tokens = sum(n for _, n in window)
        return LoadSnapshot(
            num_running_reqs=self.num_running_reqs,
            num_waiting_reqs=len(self._waiting),
            num_waiting_uncached_tokens=sum(r.uncached_at_arrival for r in self._waiting),
            num_used_tokens=used,
            max_total_num_tokens=total,
            max_running_requests=self.config.max_running_requests,
            token_usage=used / total if total else 0.0,
            cache_hit_rate=self._cached_tokens / self._prompt_tokens
            if self._prompt_tokens
            else 0.0,
            gen_throughput=tokens / seconds if seconds > 0 else 0.0,
            total_prefill_uncached_tokens=self._uncached_total,
        )
