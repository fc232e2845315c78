"""The engine hook PD decode uses: a request whose prompt KV arrived from a prefill instance."""

from __future__ import annotations

from smetric_router.engine.api import EngineConfig, EngineRequest
from smetric_router.engine.engine import Engine

PAGE = 16


def _engine() -> Engine:
    return Engine(EngineConfig(page_size=PAGE, gpu_kv_tokens=1 << 14))


def test_prefilled_request_only_decodes() -> None:
    prompt, out = list(range(1, 20 * PAGE + 1)), [7, 8, 9]
    computed = _engine()
    computed.add_request(EngineRequest("a", prompt, out))
    first = computed.step()

    decode = _engine()
    decode.add_prefilled_request(EngineRequest("a", prompt, out))
    assert decode.load().num_waiting_uncached_tokens == 0
    step = decode.step()
    assert step.emitted == [("a", 1)]  # the first token came with the KV
    assert step.duration < first.duration / 5  # no prompt computed: only the admission
    assert decode.load().num_used_tokens == len(prompt) + 1
    steps = 1
    while decode.has_work():
        decode.step()
        steps += 1
    assert steps == len(out)
    assert decode.load().total_prefill_uncached_tokens == 0
    # the transferred prompt is in the decode's tree afterwards
    assert decode.match_prefix(prompt).device == len(prompt)
