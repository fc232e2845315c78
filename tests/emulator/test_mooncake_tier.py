"""Emulated workers with `--global-tier mooncake` on a real mooncake_master (loopback).

What a real SGLang worker with `--hicache-storage-backend mooncake` does, checked the way
tests/real_sglang/test_mooncake.py checks SGLang: a prompt's pages reach the store under SGLang's
keys (seen by a separate pure client), another worker then serves them from L3
(cached_tokens_details storage), a master outage leaves every request answered from local tiers,
and a restarted master holds nothing. The workers run in this process, each with its own client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from smetric_router.emulator.__main__ import start_bound
from smetric_router.emulator.mooncake_tier import (
    ClientConfig,
    TierError,
    TierOptions,
    open_tier,
    parse_segment_size,
)
from smetric_router.emulator.server import make_app
from smetric_router.emulator.tokenizer import load_tokenizer
from smetric_router.engine.engine import Engine
from smetric_router.launch.ports import free_port
from tests.emulator.conftest import PAGE, make_config
from tests.helpers.polling import eventually
from tests.mooncake_keys import (
    capacity,
    client_env,
    pages_present,
    pure_client,
    require_mooncake,
    sglang_page_keys,
)
from tests.mooncake_master import Master
from tests.sglang_env import run_sglang_script

MODEL = "org/emu-l3"  # SGLang's prefix turns the '/' into '-'
PAGES = 24
SEGMENT = 64 << 20  # each worker's share of the store
L3_KEYS = Path(__file__).parents[1] / "real_sglang" / "sglang_scripts" / "l3_keys.py"
# quick health polling: an outage is noticed within a second; the query budget is generous (a
# loaded CI machine) but well under the ~4.3 s a call to a dead master takes
OPTIONS = TierOptions(query_timeout_s=1.0, connect_timeout_s=10, health_interval_s=0.1)


@pytest.fixture(scope="module")
def mooncake() -> Iterator[None]:
    require_mooncake()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MC_TCP_BIND_ADDRESS", "127.0.0.1")  # Mooncake's TCP transport on loopback
        yield


@pytest.fixture(scope="module")
def master(mooncake: None) -> Iterator[Master]:
    with Master() as m:
        yield m


class Emu:
    def __init__(self, url: str, http: aiohttp.ClientSession) -> None:
        self.url, self.http = url, http

    async def generate(self, ids: list[int], max_new_tokens: int = 4) -> dict[str, Any]:
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": max_new_tokens}}
        async with self.http.post(f"{self.url}/generate", json=body) as r:
            assert r.status == 200, await r.text()
            meta: dict[str, Any] = (await r.json())["meta_info"]
            return meta

    async def flush(self) -> None:
        async with self.http.post(f"{self.url}/flush_cache") as r:
            assert r.status == 200, await r.text()

    async def tier(self) -> dict[str, Any]:
        async with self.http.get(f"{self.url}/server_info") as r:
            info: dict[str, Any] = (await r.json())["emulator_global_tier"]
            return info


@contextlib.asynccontextmanager
async def workers_on(master: Master, n: int) -> AsyncIterator[list[Emu]]:
    """n emulated workers on the master, as `--global-tier mooncake` with the launcher's env."""
    config = replace(make_config(model_name=MODEL, kv_events_port=None, kv_events_replay_port=None),
                     global_tier="mooncake", mooncake=OPTIONS)  # fmt: skip
    tokenizer = load_tokenizer(config.tokenizer_path, None)
    runners = []
    try:
        async with aiohttp.ClientSession() as http:
            emus = []
            for _ in range(n):
                tier = await open_tier(MODEL, PAGE, OPTIONS, client_env(master, SEGMENT))
                app = make_app(config, Engine(config.engine, tier), tokenizer, tier)
                runner, ports = await start_bound(app)
                runners.append(runner)
                emus.append(Emu(f"http://127.0.0.1:{ports['http']}", http))
            yield emus
    finally:
        # each unmounts its segment from the master (~2 s): together
        await asyncio.gather(*(r.cleanup() for r in runners))


def prompt(seed: int) -> list[int]:
    """PAGES full pages and one token (the last is always computed, as in SGLang)."""
    return [1000 + (i * 37 + seed * 7919) % 20000 for i in range(PAGES * PAGE)] + [7]


def stored(store: Any, ids: list[int]) -> Callable[[], Awaitable[bool]]:
    keys = sglang_page_keys(MODEL, ids[: PAGES * PAGE], PAGE)

    async def check() -> bool:
        return await asyncio.to_thread(pages_present, store, keys) == [1] * PAGES

    return check


def assert_from_l3(meta: dict[str, Any]) -> None:
    assert meta["cached_tokens"] == PAGES * PAGE, meta
    assert meta["cached_tokens_details"] == {
        "device": 0, "host": 0, "storage": PAGES * PAGE, "storage_backend": "MooncakeStore"
    }, meta  # fmt: skip


async def test_pages_reach_the_store_under_sglang_keys_and_serve_another_worker(
    master: Master,
) -> None:
    ids = prompt(1)
    checker = await asyncio.to_thread(pure_client, master)
    async with workers_on(master, 2) as (a, b):
        cold = await a.generate(ids)
        assert cold["cached_tokens"] == 0 and cold["cached_tokens_details"] is None, cold
        await eventually(stored(checker, ids), "A's pages under SGLang's keys")
        # B never saw the prompt: its hit can only come from the store
        assert_from_l3(await b.generate(ids))
        # A with its own cache flushed: from the store as well
        await a.flush()
        assert_from_l3(await a.generate(ids))
        # a local hit still says which backend it has, with storage 0 (SGLang's report)
        local = await b.generate(ids)
        assert local["cached_tokens_details"] == {
            "device": PAGES * PAGE, "host": 0, "storage": 0, "storage_backend": "MooncakeStore"
        }, local  # fmt: skip


async def test_clearing_the_storage_backend_empties_the_store_for_every_worker(
    master: Master,
) -> None:
    """SGLang's POST /hicache/storage-backend/clear: what any worker wrote is gone from the
    shared store, so a worker that never saw the prompt computes it again."""
    ids = prompt(2)
    checker = await asyncio.to_thread(pure_client, master)
    async with workers_on(master, 2) as (a, b):
        await a.generate(ids)
        await eventually(stored(checker, ids), "A's pages in the store")
        keys = sglang_page_keys(MODEL, ids[: PAGES * PAGE], PAGE)

        async def cleared() -> bool:
            async with b.http.post(f"{b.url}/hicache/storage-backend/clear") as r:
                assert (r.status, await r.text()) == (
                    200, "Hierarchical cache storage backend cleared.\n"
                )  # fmt: skip
            # asked through the master's own listing: an exist query would renew the leases
            return not set(keys) & await asyncio.to_thread(master.keys)

        # remove_all keeps an object for the master's lease after its last put or get (5 s)
        await eventually(cleared, "the store emptied once the objects' leases ended", timeout=30)
        assert await asyncio.to_thread(pages_present, checker, keys) == [0] * PAGES
        meta = await b.generate(ids)
        assert meta["cached_tokens"] == 0, meta


async def test_master_outage_serves_local_only_and_a_restarted_master_is_empty(
    mooncake: None,
) -> None:
    with Master() as master:
        async with workers_on(master, 2) as (a, b):
            before = prompt(2)
            await a.generate(before)
            checker = await asyncio.to_thread(pure_client, master)
            await eventually(stored(checker, before), "A's pages in the store")

            master.kill()
            # answered without waiting on the dead master (its calls block ~4.3 s each)
            start = time.monotonic()
            during = await b.generate(before)
            assert time.monotonic() - start < 3.0
            assert during["cached_tokens"] == 0, during  # the store counts as a miss
            assert (await a.generate(prompt(3)))["cached_tokens"] == 0
            for w in (a, b):
                await eventually(partial(_tier_is, w, up=False), "the outage noticed")
            assert (await b.generate(before))["cached_tokens"] == PAGES * PAGE  # local: device

            master.start()
            for w in (a, b):
                await eventually(partial(_tier_is, w, up=True), "the master back", timeout=30)
            # the clients mount their segments again by themselves, a moment after reconnecting
            # (a put before that fails for want of space, rc -200, and is dropped)
            await eventually(lambda: _capacity(master, 2 * SEGMENT), "the segments mounted again")
            # nothing survives a restart, and nothing of the outage is written late
            assert await asyncio.to_thread(master.keys) == set()
            fresh = await asyncio.to_thread(pure_client, master)
            keys = sglang_page_keys(MODEL, before[: PAGES * PAGE], PAGE)
            assert await asyncio.to_thread(pages_present, fresh, keys) == [0] * PAGES
            await b.flush()
            again = await b.generate(before)
            assert again["cached_tokens"] == 0, again
            # and writes resume: A's new pages serve B from L3
            after = prompt(4)
            await a.generate(after)
            await eventually(stored(fresh, after), "A's pages after the restart")
            assert_from_l3(await b.generate(after))


async def test_a_hung_master_costs_a_request_at_most_the_query_budget(mooncake: None) -> None:
    """A stopped (not dead) master: calls hang and health_check keeps saying 0 (measured: for as
    long as the stop lasts here), so only the query budget protects serving."""
    with Master() as master:
        async with workers_on(master, 1) as (a,):
            proc = master.proc
            assert proc is not None
            proc.send_signal(signal.SIGSTOP)
            try:
                for seed in (6, 7, 8):
                    start = time.monotonic()
                    meta = await a.generate(prompt(seed))
                    assert time.monotonic() - start < OPTIONS.query_timeout_s + 1.5
                    assert meta["cached_tokens"] == 0
                tier = await a.tier()
                assert tier["queries"] == 1 and tier["query_timeouts"] == 3, tier
            finally:
                proc.send_signal(signal.SIGCONT)  # so that A can unmount on leaving


async def _capacity(master: Master, total: int) -> bool:
    return await asyncio.to_thread(capacity, master) == total


async def _tier_is(w: Emu, *, up: bool) -> bool:
    tier = await w.tier()
    return bool(tier["up"] == up and tier["pending_keys"] == 0)


def test_start_against_a_down_master_fails_clearly(tmp_path: Path) -> None:
    """Mooncake's own setup would retry a dead master for ~90 s; the worker gives up clearly."""
    port = free_port()
    env = {**os.environ, "MOONCAKE_MASTER": f"127.0.0.1:{port}", "MOONCAKE_PROTOCOL": "tcp"}
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "smetric_router.emulator", "--port", "0", "--global-tier",
         "mooncake", "--mooncake-connect-timeout-secs", "1", "--log-level", "warning"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1, proc
    assert f"Mooncake master at 127.0.0.1:{port} is not reachable after 1 s" in proc.stderr
    assert time.monotonic() - start < 30


def test_client_settings_are_read_as_sglang_reads_them() -> None:
    with pytest.raises(TierError, match="MOONCAKE_MASTER"):
        ClientConfig.from_env({})
    cfg = ClientConfig.from_env({"MOONCAKE_MASTER": "h:1", "MOONCAKE_GLOBAL_SEGMENT_SIZE": "2gb"})
    assert cfg == ClientConfig("h:1", "P2PHANDSHAKE", "rdma", "", 2 << 30, "localhost")
    assert parse_segment_size("268435456") == 256 << 20
    with pytest.raises(TierError, match="'<N>gb' or a number of bytes"):
        parse_segment_size("256mb")  # SGLang refuses it too


@pytest.mark.sglang
async def test_sglangs_own_key_function_finds_the_emulated_pages(master: Master) -> None:
    """The keys are SGLang's as SGLang computes them (get_hash_str, run in .venv-sglang)."""
    ids = prompt(5)
    arg = {"master": master.rpc_address, "metadata": master.metadata_url, "page_size": PAGE,
           "prefix": MODEL.replace("/", "-"), "token_ids": ids[: PAGES * PAGE]}  # fmt: skip
    async with workers_on(master, 1) as (a,):
        await a.generate(ids)
        checker = await asyncio.to_thread(pure_client, master)
        await eventually(stored(checker, ids), "the pages in the store")
        # while A is up: its objects live in the segment it lends
        out = await asyncio.to_thread(run_sglang_script, L3_KEYS, json.dumps(arg), timeout=300)
    assert out["exist"] == [1] * (2 * PAGES), out
