"""The emulated worker answers in real SGLang 0.5.23's shapes: every endpoint, streamed and not,
error replies and the KV-event wire frames, compared key by key and type by type (not by value)
against a live SGLang worker given the same requests (shape_probes.PROBES).

The real worker runs with the flags the emulator stands for: page size 16, HiCache, KV events
bound with replay, `--enable-cache-report` and `--enable-metrics` (the emulator always serves
/metrics, and with metrics SGLang adds request timing keys to /generate's meta_info). Every
difference the emulator keeps is listed in ALLOWED with its reason; an entry no difference needs
any more fails test_allowed_differences_are_still_needed, so the list stays honest.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from smetric_router.launch import ClusterSpec, RouterSpec, Stack, WorkerSpec
from tests.real_sglang.conftest import get_json, require_sglang_env, sglang_spec
from tests.real_sglang.shape_probes import PROBES, KvTap, capture
from tests.real_sglang.shapes import Allowed, differences, unused

pytestmark = pytest.mark.sglang

# /server_info holds every one of SGLang's ~550 server args; these are the ones clients read
# (routers: page_size, kv_events, disaggregation_*; benchmarks: model and token limits) and every
# key the emulator reports besides its own `emulat*` ones.
SERVER_INFO_KEYS = (
    "model_path", "served_model_name", "tokenizer_path", "host", "port", "page_size",
    "chunked_prefill_size", "max_running_requests", "max_total_num_tokens", "max_req_input_len",
    "enable_hierarchical_cache", "hicache_storage_backend", "tp_size", "dp_size",
    "disaggregation_mode", "disaggregation_bootstrap_port", "disaggregation_transfer_backend",
    "enable_cache_report", "enable_metrics", "weight_version", "kv_events_config", "kv_events",
    "internal_states", "version", "startup_time",
)  # fmt: skip
INTERNAL_STATE_KEYS = ("effective_max_running_requests_per_dp", "last_gen_throughput")

ALLOWED = (
    Allowed("server_info.body.emulat*", "emulator",
            "the emulator says what it is (emulated, emulator_notice, its profile, speed-up, "
            "host tier size, PD link model)"),
    Allowed("server_info.body.max_running_requests: int", "emulator",
            "SGLang echoes the CLI value (null unless --max-running-requests is given); the "
            "emulator always reports its engine's batch limit"),
    Allowed("server_info.body.max_running_requests: null", "real",
            "as above: the real worker runs without --max-running-requests"),
    Allowed("model_info.body.embedding*", "real",
            "SGLang's embedding-capability block (constant for a generation model); no client "
            "of a generation worker reads it"),
    Allowed("model_info.body.emulat*", "emulator", "the emulator says what it is"),
    Allowed("model_info.body.tool_call_parser: str", "emulator",
            "the emulated Qwen3-Coder stands in for a worker started with --tool-call-parser "
            "qwen3_coder (its tool calls are answered as that parser reports them); the tiny "
            "real worker runs without a parser"),
    Allowed("model_info.body.tool_call_parser: null", "real", "as above"),
    Allowed("v1_loads*.body.accelerator: null", "real",
            "the device name; null on this CPU machine, a string (\"NVIDIA H20\") on GPUs, "
            "where the emulator's \"emulated\" stands"),
    Allowed("v1_loads*.body.accelerator: str", "emulator", "as above"),
    Allowed("v1_loads_idle.body.loads[].decode_moments*", "real",
            "null until a first decode step, as in SGLang; the real worker has decoded its "
            "start-up warm-up request, the emulator runs no warm-up"),
    Allowed("v1_loads_idle.body.loads[].decode_moments: null", "emulator", "as above"),
    Allowed("*.choices[].matched_stop: int", "emulator",
            "the emulator's chat answers end their turn on <|im_end|> (finish stop, matched "
            "token id); the tiny random-weight model runs out of max_tokens (matched null)"),
    Allowed("chat*.body.choices[].matched_stop: null", "real", "as above"),
    Allowed("metrics.body.sglang:*", "real",
            "the emulator exports a subset of SGLang's Prometheus families, under the same "
            "names and types (a family only the emulator has is a failure)"),
)  # fmt: skip


def _project(info: Any) -> Any:
    if not isinstance(info, dict):
        return info
    out = {k: info[k] for k in SERVER_INFO_KEYS if k in info}
    out |= {k: v for k, v in info.items() if k.startswith("emulat")}
    states = out.get("internal_states")
    if isinstance(states, list):
        out["internal_states"] = [
            {k: s[k] for k in INTERNAL_STATE_KEYS if k in s} for s in states if isinstance(s, dict)
        ]
    return out


def comparable(tree: dict[str, Any]) -> dict[str, Any]:
    """A capture with /server_info cut down to SERVER_INFO_KEYS (and emulator keys)."""
    out = dict(tree)
    info = dict(out["server_info"])
    info["body"] = _project(info["body"])
    out["server_info"] = info
    return out


def _emulated_stack() -> Stack:
    spec = ClusterSpec(
        router=RouterSpec(port=0),
        workers=WorkerSpec(kind="emulated", count=1, page_size=16, speedup=20.0),
    )
    return Stack(spec)


def _capture(url: str) -> dict[str, Any]:
    info = get_json(url + "/server_info")
    tap = KvTap(info["kv_events"])
    tap.start()
    try:
        tree = capture(url)
    finally:
        tap.stop()
    tree["kv_events"] = tap.tree()
    return tree


@pytest.fixture(scope="module")
def captures() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(real, emulated) replies to PROBES: one real SGLang worker (~1 min to start), then one
    emulated worker, each started by the launcher and stopped before the next starts."""
    require_sglang_env()
    stacks = [Stack(sglang_spec(workers=1, metrics=True)), _emulated_stack()]
    trees = []
    for stack in stacks:
        try:
            stack.start_workers()
            trees.append(comparable(_capture(stack.worker_urls[0])))
        finally:
            stack.stop()
    yield trees[0], trees[1]


NAMES = [p.name for p in PROBES] + ["kv_events"]


@pytest.mark.parametrize("name", NAMES)
def test_shape_matches_real_sglang(
    captures: tuple[dict[str, Any], dict[str, Any]], name: str
) -> None:
    real, emulated = captures
    diff = differences({name: real[name]}, {name: emulated[name]}, ALLOWED)
    assert not diff, "\n".join(diff)


def test_allowed_differences_are_still_needed(
    captures: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    real, emulated = captures
    stale = unused(real, emulated, ALLOWED)
    assert not stale, [a.pattern for a in stale]


def test_any_model_name_is_served_and_echoed(
    captures: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    for tree in captures:
        assert tree["chat"]["body"]["model"] == "whatever-model"
        assert tree["completion"]["body"]["model"] == "whatever-model"
        assert tree["chat_no_model"]["body"]["model"] == "default"
        assert {c["model"] for c in tree["chat_stream"]["body"][:-1]} == {"m"}
        assert tree["chat_lora_syntax"]["status"].value == "400"


def test_kv_events_flow_on_both(captures: tuple[dict[str, Any], dict[str, Any]]) -> None:
    for tree in captures:
        kinds = {
            ev["type"] for batch in tree["kv_events"]["live"] for ev in batch["payload"]["[1]"]
        }
        assert {"BlockStored", "AllBlocksCleared"} <= kinds
        assert tree["server_info"]["body"]["kv_events"]["block_size"] == 16
