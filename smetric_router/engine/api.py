"""The engine model's public contract: shared by the emulated worker (real time) and the simulator
(virtual time). The engine is plain synchronous Python: no asyncio, no clock of its own; the caller
advances it step by step and sleeps (emulator) or jumps (simulator) by StepResult.duration.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from smetric_router.core.flags import Flag, option
from smetric_router.core.kv_events import KVCacheEvent


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """One engine; the flags are the emulated worker's (SGLang's names where it has them)."""

    page_size: int = option(16, Flag("--page-size", "KV page size in tokens"))
    # GPU-tier capacity in tokens (profile may override)
    gpu_kv_tokens: int = option(262_144, Flag("--gpu-kv-tokens", "GPU-tier KV capacity (tokens)"))
    host_kv_tokens: int = option(
        0,
        Flag("--host-kv-tokens", "HiCache host-tier KV capacity (tokens); 0 = no host tier"),
    )
    chunked_prefill_size: int = option(
        8192,
        Flag(
            "--chunked-prefill-size",
            "new prompt tokens computed per step (SGLang's --chunked-prefill-size)",
        ),
    )
    max_running_requests: int = option(
        256, Flag("--max-running-requests", "batch size limit (SGLang's --max-running-requests)")
    )
    profile: str = option(
        "h20-qwen3-coder-30b-a3b",
        Flag("--profile", "engine timing profile name (engine/profiles/NAME.json)"),
    )
    enable_priority_scheduling: bool = option(
        False,
        Flag(
            "--enable-priority-scheduling",
            "order the waiting queue by the requests' `priority` (higher first, then arrival), "
            "as SGLang's flag does. SGLang also preempts running requests for one more than "
            "--priority-scheduling-preemption-threshold (10) above them, which is not modelled: "
            "give real workers --default-priority-value 0 (or --disable-priority-preemption) "
            "and small priorities for the same behaviour",
        ),
    )
    default_priority_value: int | None = option(
        None,
        Flag(
            "--default-priority-value",
            "with --enable-priority-scheduling, the priority of a request that asks none (as "
            "SGLang's flag; without it such a request comes after every other)",
            default_text="the lowest",
        ),
    )


@dataclass(slots=True)
class EngineRequest:
    rid: str
    input_ids: list[int]
    # what the emulated model will emit (ends with EOS/im_end); read when the request ends, so
    # a lazy sequence is drawn only as far as the answer goes
    output_ids: Sequence[int]
    # Token-free requests (the simulator): leave input_ids/output_ids empty and give the lengths
    # and the page hashes of every full page of prompt + output, so nothing is hashed per token.
    page_hashes: list[int] | None = None
    input_len: int = 0
    output_len: int = 0
    # SGLang's; None: the config's default_priority_value. Read only with priority scheduling
    priority: int | None = None


@dataclass(frozen=True, slots=True)
class CachedTokens:
    """Prompt tokens served from cache at scheduling time (SGLang cached_tokens_details)."""

    device: int = 0
    host: int = 0
    storage: int = 0

    @property
    def total(self) -> int:
        return self.device + self.host + self.storage


@dataclass(slots=True)
class StepResult:
    duration: float  # seconds of model time this step takes
    scheduled: list[tuple[str, CachedTokens]] = field(
        default_factory=list
    )  # rids admitted this step
    emitted: list[tuple[str, int]] = field(default_factory=list)  # (rid, new output tokens)
    finished: list[str] = field(default_factory=list)
    kv_events: list[KVCacheEvent] = field(default_factory=list)
    steps: int = 1  # forwards this result covers (Engine.step_many fast-forwards several)


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    """The fields of SGLang's /v1/loads entry the engine can report."""

    num_running_reqs: int
    num_waiting_reqs: int
    num_waiting_uncached_tokens: int
    num_used_tokens: int
    max_total_num_tokens: int
    max_running_requests: int
    token_usage: float
    cache_hit_rate: float
    gen_throughput: float
    total_prefill_uncached_tokens: int


class EngineModel(Protocol):
    """What engine/engine.py's `Engine(config: EngineConfig)` provides."""

    config: EngineConfig

    def add_request(self, req: EngineRequest) -> None: ...

    def add_prefilled_request(self, req: EngineRequest) -> None:
        """PD decode: the prompt's KV is already present (transferred); the request only decodes."""
        ...

    def abort(self, rid: str) -> None: ...

    def has_work(self) -> bool: ...

    def step(self) -> StepResult:
        """One scheduler iteration: admit, chunked prefill, one decode token per running req."""
        ...

    def match_prefix(self, token_ids: list[int]) -> CachedTokens:
        """Read-only: leading tokens of token_ids held per tier (device, host), page-aligned."""
        ...

    def flush(self) -> bool:
        """Drop every cached page (emits AllBlocksCleared); False while requests run or wait."""
        ...

    def load(self) -> LoadSnapshot: ...

    def drain_events(self) -> list[KVCacheEvent]:
        """KV events produced outside step() (e.g. by flush)."""
        ...
