"""SGLang's request `priority` on the emulated worker: with --enable-priority-scheduling a request
asking more leaves the queue first (forward_entry_time, SGLang's admission moment, says when), one
asking none comes last unless --default-priority-value says otherwise (SGLang's scheduler gives it
the lowest priority there is), and a priority that is not an integer is refused as SGLang's
validation refuses it."""

from __future__ import annotations

import asyncio
from typing import Any

from smetric_router.engine.api import EngineConfig
from tests.emulator.conftest import PAGE, Worker, make_config, serving
from tests.helpers.polling import eventually


def _gen(tag: int, new_tokens: int, **extra: Any) -> dict[str, Any]:
    sampling = {"max_new_tokens": new_tokens, "ignore_eos": True}
    return {"input_ids": [tag] * 64, "sampling_params": sampling, **extra}


async def _waiting(w: Worker, n: int) -> bool:
    _, loads = await w.get("/v1/loads")
    return bool(loads["loads"][0]["num_waiting_reqs"] == n)


async def _admission_order(**settings: Any) -> list[str]:
    """Three requests queued behind one holding the only batch slot, in the order they left the
    queue (settings: EngineConfig's priority settings)."""
    engine = EngineConfig(page_size=PAGE, gpu_kv_tokens=1 << 16, max_running_requests=1, **settings)
    async with serving(make_config(engine=engine, speedup=5.0)) as w:
        running = asyncio.ensure_future(w.post("/generate", _gen(1, 300)))
        await eventually(lambda: _waiting(w, 0), "the first request running", interval=0.01)
        queued = {}
        for name, tag, asked in (("new", 2, None), ("follow-up", 3, 1), ("other", 4, 0)):
            extra = {} if asked is None else {"priority": asked}
            queued[name] = asyncio.ensure_future(w.post("/generate", _gen(tag, 1, **extra)))
        await eventually(lambda: _waiting(w, 3), "three requests queued", interval=0.01)
        assert not running.done(), "the first request ended before the others were queued"
        entered = {}
        for name, fut in queued.items():
            status, out = await fut
            assert status == 200, out
            entered[name] = out["meta_info"]["forward_entry_time"]
        assert (await running)[0] == 200
        return sorted(entered, key=entered.__getitem__)


async def test_priority_scheduling_admits_the_higher_priority_first_and_none_last() -> None:
    order = await _admission_order(enable_priority_scheduling=True)
    assert order == ["follow-up", "other", "new"]


async def test_a_default_priority_value_places_requests_that_ask_none() -> None:
    order = await _admission_order(enable_priority_scheduling=True, default_priority_value=0)
    assert order == ["follow-up", "new", "other"]  # "new" is 0 too, and came first


async def test_without_priority_scheduling_arrival_order_stands() -> None:
    assert await _admission_order() == ["new", "follow-up", "other"]


async def test_a_priority_that_is_not_an_integer_is_refused(worker: Worker) -> None:
    for bad in ("high", 1.5, True):
        status, out = await worker.post("/generate", _gen(5, 1, priority=bad))
        assert status == 400 and "priority" in str(out), bad
        status, out = await worker.post(
            "/v1/chat/completions",
            {"model": worker.config.model_name, "priority": bad,
             "messages": [{"role": "user", "content": "hi"}]},
        )  # fmt: skip
        assert status == 400 and "priority" in str(out), bad
