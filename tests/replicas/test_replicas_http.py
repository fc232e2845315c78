"""Router replicas over HTTP: each sees what the others have in flight, and places by it.

The fake workers report no load of their own (/v1/loads says 0), so whatever a replica knows of
another's requests it knows from the sync."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.helpers.polling import eventually
from tests.helpers.prometheus import scrape, value
from tests.helpers.router_process import router_process
from tests.router.fakes import FakeWorker, free_port


@pytest.fixture
async def stalled() -> AsyncIterator[list[FakeWorker]]:
    """Two workers that hold every generation request until released."""
    workers = [await FakeWorker(name).start() for name in ("w0", "w1")]
    for w in workers:
        w.stall = True
    try:
        yield workers
    finally:
        for w in workers:
            w.release.set()
            await w.close()


def chat(n: int) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": f"task {n} " * 40}]}


async def workers_view(http: aiohttp.ClientSession, url: str) -> dict[str, dict[str, int]]:
    """Each worker's in-flight counts as the replica that answers sees them (a new connection
    each time: under --processes, any process may answer)."""
    async with http.get(url + "/workers", headers={"Connection": "close"}) as r:
        assert r.status == 200, await r.text()
        keys = ("peers", "load", "unprefilled", "unprefilled_load")
        return {w["url"]: {k: int(w[k]) for k in keys} for w in (await r.json())["workers"]}


async def peers_heard(url: str, n: int) -> bool:
    text = await asyncio.to_thread(scrape, url)
    return value(text, "smetric_replica_peers") == n


def sync_args(workers: Sequence[FakeWorker], bind: str, peers: Sequence[str]) -> list[str]:
    return ["--worker-urls", *(w.url for w in workers), "--load-poll-interval-secs", "60",
            "--replica-sync-bind", bind, "--replica-sync-peers", *peers]  # fmt: skip


async def test_a_replica_places_a_first_turn_by_what_another_has_in_flight(
    stalled: list[FakeWorker], tmp_path: Path
) -> None:
    ends = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    async with (
        router_process(sync_args(stalled, ends[0], ends), tmp_path / "a.json") as a,
        router_process(sync_args(stalled, ends[1], ends), tmp_path / "b.json") as b,
        aiohttp.ClientSession() as http,
    ):
        await eventually(lambda: peers_heard(a, 1), "replica a to hear b")
        await eventually(lambda: peers_heard(b, 1), "replica b to hear a")
        first = asyncio.create_task(http.post(a + "/v1/chat/completions", json=chat(1)))
        await eventually(lambda: sum(len(w.bodies) for w in stalled) == 1, "a's request held")
        (held,) = [w for w in stalled if w.bodies]

        # its prompt, held before its first token, is unprefilled at a and, through the sync, at b
        sent = (await workers_view(http, a))[held.url]["unprefilled"]
        assert sent > 0

        async def b_sees_it() -> bool:
            view = (await workers_view(http, b))[held.url]
            return (view["peers"], view["load"], view["unprefilled_load"]) == (1, 1, sent)

        await eventually(b_sees_it, "replica b to count a's request and its prompt on its worker")
        second = asyncio.create_task(http.post(b + "/v1/chat/completions", json=chat(2)))
        await eventually(lambda: sum(len(w.bodies) for w in stalled) == 2, "b's request held")
        assert [len(w.bodies) for w in stalled] == [1, 1]  # b went to the other worker
        for w in stalled:
            w.release.set()
        for task in (first, second):
            async with await task as r:
                assert r.status == 200

        async def b_forgets_it() -> bool:
            view = (await workers_view(http, b))[held.url]
            return (view["peers"], view["unprefilled_load"]) == (0, 0)

        await eventually(b_forgets_it, "a's finished request to stop counting in b")


async def test_a_replica_that_stops_stops_counting(
    stalled: list[FakeWorker], tmp_path: Path
) -> None:
    ends = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    async with (
        router_process(sync_args(stalled, ends[1], ends), tmp_path / "b.json") as b,
        aiohttp.ClientSession() as http,
    ):
        async with router_process(sync_args(stalled, ends[0], ends), tmp_path / "a.json") as a:
            await eventually(lambda: peers_heard(b, 1), "replica b to hear a")
            held = asyncio.create_task(http.post(a + "/v1/chat/completions", json=chat(1)))

            async def counted() -> bool:
                return sum(w["peers"] for w in (await workers_view(http, b)).values()) == 1

            await eventually(counted, "replica b to count a's request")
        # a was stopped with its request still held by the worker

        async def gone() -> bool:
            return await peers_heard(b, 0) and not await counted()

        await eventually(gone, "replica b to drop the stopped replica's counts")
        held.cancel()  # its router is gone: the client's request failed


async def test_processes_replicas_see_one_load(stalled: list[FakeWorker], tmp_path: Path) -> None:
    """--processes 3: every process answers /workers with the held request counted, whichever
    of them routed it (each new connection may reach another process)."""
    args = ["--worker-urls", *(w.url for w in stalled), "--load-poll-interval-secs", "60",
            "--processes", "3"]  # fmt: skip
    async with (
        router_process(args, tmp_path / "p.json") as url,
        aiohttp.ClientSession() as http,
    ):
        pids: set[int] = set()

        async def all_hear_two() -> bool:
            async with http.get(url + "/health", headers={"Connection": "close"}) as r:
                pids.add(int((await r.json())["pid"]))
            return len(pids) == 3 and await peers_heard(url, 2)

        await eventually(all_hear_two, "three processes, each hearing two peers")
        request = asyncio.create_task(http.post(url + "/v1/chat/completions", json=chat(1)))
        await eventually(lambda: sum(len(w.bodies) for w in stalled) == 1, "the request held")
        (held,) = [w for w in stalled if w.bodies]

        async def twelve_agree() -> bool:
            seen = set()
            for _ in range(12):
                view = (await workers_view(http, url))[held.url]
                seen.add((view["load"], view["unprefilled_load"]))
            if len(seen) != 1:
                return False
            load, unprefilled = seen.pop()
            return load == 1 and unprefilled > 0  # its prompt waits for a first token

        await eventually(twelve_agree, "every process to count the held request")
        held.release.set()
        async with await request as r:
            assert r.status == 200


async def test_processes_without_sync_hear_no_one(
    stalled: list[FakeWorker], tmp_path: Path
) -> None:
    args = ["--worker-urls", *(w.url for w in stalled), "--processes", "2", "--no-replica-sync"]
    async with router_process(args, tmp_path / "p.json") as url:
        pids: set[int] = set()

        async def both_answer_alone() -> bool:
            async with (
                aiohttp.ClientSession() as http,
                http.get(url + "/health", headers={"Connection": "close"}) as r,
            ):
                pids.add(int((await r.json())["pid"]))
            assert "smetric_replica_peers" not in await asyncio.to_thread(scrape, url)
            return len(pids) == 2

        await eventually(both_answer_alone, "both processes to answer, neither syncing")
