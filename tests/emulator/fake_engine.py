"""A minimal EngineModel for the emulator's tests (the real engine is tested on its own): a set of
cached page-hash chains, everything admitted at once, one token per step per request."""

from __future__ import annotations

from smetric_router.core.kv_events import GPU, AllBlocksCleared, BlockStored, KVCacheEvent
from smetric_router.engine.api import (
    CachedTokens,
    EngineConfig,
    EngineRequest,
    LoadSnapshot,
    StepResult,
)
from smetric_router.features.hashing import page_hashes

STEP_S = 0.002


class FakeEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._cached: set[int] = set()
        self._waiting: list[EngineRequest] = []
        self._running: dict[str, tuple[EngineRequest, int]] = {}
        self._pending: list[KVCacheEvent] = []

    def add_request(self, req: EngineRequest) -> None:
        self._waiting.append(req)

    def abort(self, rid: str) -> None:
        self._waiting = [r for r in self._waiting if r.rid != rid]
        self._running.pop(rid, None)

    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    def _store(self, ids: list[int]) -> list[KVCacheEvent]:
        ps = self.config.page_size
        hashes = page_hashes(ids, ps)
        new = [i for i, h in enumerate(hashes) if h not in self._cached]
        if not new:
            return []
        self._cached.update(hashes)
        first = new[0]
        return [
            BlockStored(
                block_hashes=hashes[first:],
                parent_block_hash=hashes[first - 1] if first else None,
                token_ids=ids[first * ps : len(hashes) * ps],
                block_size=ps,
                lora_id=None,
                medium=GPU,
            )
        ]

    def step(self) -> StepResult:
        r = StepResult(duration=STEP_S)
        for req in self._waiting:
            r.scheduled.append((req.rid, self.match_prefix(req.input_ids)))
            r.kv_events += self._store(req.input_ids)
            self._running[req.rid] = (req, 0)
        self._waiting = []
        for rid, (req, n) in list(self._running.items()):
            r.emitted.append((rid, 1))
            if n + 1 == len(req.output_ids):
                del self._running[rid]
                r.finished.append(rid)
                # Like SGLang, the last token's KV is never computed, so it is not cached.
                r.kv_events += self._store(req.input_ids + req.output_ids[:-1])
            else:
                self._running[rid] = (req, n + 1)
        return r

    def match_prefix(self, token_ids: list[int]) -> CachedTokens:
        n = 0
        for h in page_hashes(token_ids, self.config.page_size):
            if h not in self._cached:
                break
            n += self.config.page_size
        return CachedTokens(device=n)

    def flush(self) -> bool:
        if self.has_work():
            return False
        self._cached.clear()
        self._pending.append(AllBlocksCleared())
        return True

    def load(self) -> LoadSnapshot:
        used = len(self._cached) * self.config.page_size
        total = self.config.gpu_kv_tokens
        return LoadSnapshot(
            num_running_reqs=len(self._running),
            num_waiting_reqs=len(self._waiting),
            num_waiting_uncached_tokens=0,
            num_used_tokens=used,
            max_total_num_tokens=total,
            max_running_requests=self.config.max_running_requests,
            token_usage=used / total,
            cache_hit_rate=0.0,
            gen_throughput=0.0,
            total_prefill_uncached_tokens=0,
        )

    def drain_events(self) -> list[KVCacheEvent]:
        out, self._pending = self._pending, []
        return out
