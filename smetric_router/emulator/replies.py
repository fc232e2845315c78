"""Pieces of SGLang 0.5.23's generation replies, in the key layout its server writes them.

Checked against a live SGLang 0.5.23 worker by tests/real_sglang/test_emulator_shape.py. The
worker it stands in for runs with `--enable-cache-report` (usage.prompt_tokens_details) and
`--enable-metrics` (the emulator always serves /metrics), which adds the request timing keys to
/generate's meta_info.
"""

from __future__ import annotations

import time
from typing import Any

from smetric_router.emulator.runner import Tracked

Json = dict[str, Any]
WEIGHT_VERSION = "default"  # SGLang's --weight-version default


def cached_details(t: Tracked) -> Json | None:
    """meta_info.cached_tokens_details / sglext.cached_tokens_details: per-tier hit, or None
    without a hit (SGLang's OutputStreamer.get_cached_tokens_details)."""
    c = t.cached
    if c is None or c.total == 0:
        return None
    d: Json = {"device": c.device, "host": c.host}
    if c.storage or t.storage_backend is not None:
        d["storage"] = c.storage
    if t.storage_backend is not None:  # SGLang names its L3 backend whenever it has one
        d["storage_backend"] = t.storage_backend
    return d


def weight_versions(t: Tracked) -> list[Json]:
    return [{"version": WEIGHT_VERSION, "start": 0, "end": t.n_out}]


def metadata(t: Tracked) -> Json:
    """The OpenAI replies' `metadata` (non-streamed)."""
    return {"weight_version": WEIGHT_VERSION, "weight_versions": weight_versions(t)}


def usage(t: Tracked, details_key: bool = True) -> Json:
    """OpenAI usage with the cache report; the completions stream's usage chunk is written
    without null fields (no completion_tokens_details)."""
    prompt = len(t.input_ids)
    u: Json = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + t.n_out,
        "completion_tokens": t.n_out,
        "prompt_tokens_details": {"cached_tokens": t.cached_total},
        "reasoning_tokens": 0,
    }
    if details_key:
        u["completion_tokens_details"] = None
    return u


def meta_info(
    t: Tracked, finish_reason: Json | None, *, first: bool, final: bool, decode_role: bool
) -> Json:
    """/generate's meta_info for one chunk (or the whole reply: first and final).

    Scheduler-side timing keys ride on every chunk once set; the tokenizer-side ones
    (request_received_ts, first_token_latency, ...) on the final chunk only, and
    response_sent_to_client_ts on the first and the final, as in SGLang with --enable-metrics.
    Times are wall-clock seconds of this process.
    """
    now = time.time()
    meta: Json = {
        "id": t.rid,
        "finish_reason": finish_reason,
        "prompt_tokens": len(t.input_ids),
        "weight_version": WEIGHT_VERSION,
        "num_retractions": 0,
    }
    if not decode_role:
        meta["storage_prefetch_wait"] = 0.0
        meta["storage_staging_wait"] = 0.0
    if t.admitted_wall is not None:
        meta["forward_entry_time"] = t.admitted_wall
    if t.first_token_wall is not None:
        meta["prefill_finished_time"] = t.first_token_wall
    entered = t.admitted_wall if t.admitted_wall is not None else t.received_wall
    meta["queue_time"] = entered - t.received_wall
    meta["reasoning_tokens"] = 0
    meta["completion_tokens"] = t.n_out
    meta["cached_tokens"] = t.cached_total
    if final:
        meta["weight_versions"] = weight_versions(t)
    meta["cached_tokens_details"] = cached_details(t)
    meta["dp_rank"] = None
    if final:
        meta["e2e_latency"] = time.monotonic() - t.started
        meta["request_received_ts"] = t.received_wall
        if t.first_token_wall is not None:
            meta["first_token_latency"] = t.first_token_wall - t.received_wall
        meta["api_server_dispatch_finish_ts"] = t.received_wall
    if first or final:
        meta["response_sent_to_client_ts"] = now
    if final and t.finished_wall is not None:
        meta["request_finished_ts"] = t.finished_wall
        decode = t.finished_wall - (t.first_token_wall or t.finished_wall)
        if t.n_out > 1 and decode > 0:
            meta["decode_throughput"] = (t.n_out - 1) / decode
    return meta
