"""Discovery end to end: the real router process, started with --service-discovery against the
stand-in Kubernetes API (tests/helpers/kube_api.py) through a kubeconfig, and with
--discovery-provider file; its pods and entries point at emulated workers on 127.0.0.2-5, one
port for all as in a cluster. What the router's /workers, decisions and /metrics show is
checked as pods come, become ready, stop being ready, go and move, and as the file is edited."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import aiohttp
import pytest

from tests.e2e.raw import generate, listed_workers, token_ids, wait_indexed
from tests.helpers.emulated import emulators_on, free_port
from tests.helpers.kube_api import KubeApiStandIn
from tests.helpers.polling import eventually
from tests.helpers.prometheus import scrape, total
from tests.reported import reported

NS = "inference"
APP = {"app": "sglang"}
HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
TURN = {"x-smetric-turn": "1"}
FIRST = {"x-smetric-turn": "0"}
ROUTER_ARGS = ("--load-poll-interval-secs", "0.1", "--health-check-interval-secs", "0.5",
               "--log-level", "info")  # fmt: skip


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, dict[str, str]]]:
    """(port, host -> URL) of emulated workers on HOSTS."""
    port = free_port(HOSTS[0])
    with emulators_on(HOSTS, port, tmp_path_factory.mktemp("emulators")) as urls:
        yield port, urls


@contextlib.contextmanager
def router(args: Sequence[str], port_file: Path) -> Iterator[str]:
    with reported(["smetric_router", "--port", "0", *ROUTER_ARGS, *args], port_file) as ports:
        yield f"http://127.0.0.1:{ports['http']}"


async def worker_set(http: aiohttp.ClientSession, url: str) -> set[str]:
    return set(await listed_workers(http, url))


async def until_workers(http: aiohttp.ClientSession, url: str, want: set[str], what: str) -> None:
    async def check() -> bool:
        return await worker_set(http, url) == want

    await eventually(check, f"/workers to be {sorted(want)}: {what}")


def requests_served(worker: str) -> float:
    return total(scrape(worker), "sglang:num_requests_total")


async def test_pods_drive_the_worker_list_and_sessions_keep_sticking(
    workers: tuple[int, dict[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port, url = workers
    a, b, c, d = (url[h] for h in HOSTS)
    api = KubeApiStandIn(bookmark_interval=0.5)
    await api.start()
    monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    api.set_pod(NS, "a", APP, ip=HOSTS[0])
    api.set_pod(NS, "b", APP, phase="Pending", ready=False)
    api.set_pod(NS, "not-a-worker", {"app": "other"}, ip=HOSTS[2])
    api.set_pod("elsewhere", "same-labels", APP, ip=HOSTS[3])
    flags = ["--service-discovery", "--selector", "app=sglang", "--service-discovery-namespace",
             NS, "--service-discovery-port", str(port)]  # fmt: skip
    try:
        async with aiohttp.ClientSession() as http:
            with router(flags, tmp_path / "router.json") as r:
                await until_workers(http, r, {a}, "the one ready pod of the namespace")
                api.set_pod(NS, "b", APP, ip=HOSTS[1], ready=False)
                api.set_pod(NS, "b", APP, ip=HOSTS[1])
                await until_workers(http, r, {a, b}, "b once Ready")

                # a session settles on one of them...
                session = token_ids(seed=7, n=480)
                home, reason = await generate(http, r, session, FIRST)
                assert reason == "first-turn-balance" and home in (a, b)
                other_pod = "b" if home == a else "a"
                other_ip = HOSTS[1] if home == a else HOSTS[0]
                await wait_indexed(http, r, home, session)

                async def follow_up(turn: int) -> None:
                    nonlocal session
                    session = session + token_ids(seed=100 + turn, n=32)
                    assert await generate(http, r, session, TURN) == (home, "sticky")

                # ...and sticks there while unrelated pods come, go and flap
                api.set_pod(NS, "c", APP, ip=HOSTS[2])
                await until_workers(http, r, {a, b, c}, "c added")
                await follow_up(1)
                api.set_pod(NS, other_pod, APP, ip=other_ip, ready=False)
                await until_workers(http, r, {home, c}, "the other pod not ready")
                await follow_up(2)
                api.set_pod(NS, other_pod, APP, ip=other_ip)
                await until_workers(http, r, {a, b, c}, "the other pod ready again")
                await follow_up(3)

                # a deleted pod's worker gets no more requests
                api.delete_pod(NS, "c")
                await until_workers(http, r, {a, b}, "c deleted")
                served = requests_served(c)
                for seed in range(200, 208):
                    worker, _ = await generate(http, r, token_ids(seed=seed, n=64), FIRST)
                    assert worker in (a, b)
                assert requests_served(c) == served
                await follow_up(4)

                # a pod that comes back at another IP is a new worker
                api.set_pod(NS, "c", APP, ip=HOSTS[2])
                await until_workers(http, r, {a, b, c}, "c back")
                api.set_pod(NS, "c", APP, ip=HOSTS[3])
                await until_workers(http, r, {a, b, d}, "c at its new IP")
                await follow_up(5)

                # a dropped watch, and history gone while the router was away
                api.drop_watches()
                api.delete_pod(NS, "c")
                api.compact()
                await until_workers(http, r, {a, b}, "c gone, seen through a re-list")
                await follow_up(6)

                text = scrape(r)
                added = "smetric_discovery_workers_added_total"
                removed = "smetric_discovery_workers_removed_total"
                assert total(text, added, provider="kubernetes", reason="pod_ready") == 6
                for reason, n in (("not_ready", 1), ("deleted", 1), ("ip_changed", 1),
                                  ("resync", 1)):  # fmt: skip
                    assert total(text, removed, reason=reason) == n, reason
                assert total(text, "smetric_discovery_resyncs_total", reason="gone") == 1
                assert total(text, "smetric_discovery_watch_restarts_total") >= 1
                assert total(text, "smetric_discovery_workers", provider="kubernetes") == 2
                age = total(text, "smetric_discovery_last_event_age_seconds")
                assert 0 <= age < 10

            # while no router runs, the cluster changes; a new router lists it as it is
            api.delete_pod(NS, "a")
            api.set_pod(NS, "c", APP, ip=HOSTS[2])
            with router(flags, tmp_path / "router2.json") as r:
                await until_workers(http, r, {b, c}, "the list after a restart")
                watch = api.watch_requests()[-1]
                assert watch["allowWatchBookmarks"] in ("true", "True")
    finally:
        await api.stop()


async def test_discovery_file_edits_reach_the_worker_list(
    workers: tuple[int, dict[str, str]], tmp_path: Path
) -> None:
    _, url = workers
    a, b, c, _ = (url[h] for h in HOSTS)
    path = tmp_path / "workers.yaml"
    path.write_text(f'[{{"url": "{a}"}}]')  # JSON is YAML too
    flags = ["--discovery-provider", "file", "--discovery-file", str(path),
             "--discovery-file-interval-secs", "0.1"]  # fmt: skip
    async with aiohttp.ClientSession() as http:
        with router(flags, tmp_path / "router.json") as r:
            await until_workers(http, r, {a}, "the file's one worker")
            path.write_text(f"- url: {a}\n- {b}\n")
            await until_workers(http, r, {a, b}, "b added to the file")
            # what a's session built is dropped with it, and b's is kept
            session = token_ids(seed=11, n=320)
            home, _ = await generate(http, r, session, FIRST)
            await wait_indexed(http, r, home, session)
            path.write_text(f"- {home}\n")
            await until_workers(http, r, {home}, "the other worker removed from the file")
            assert await generate(http, r, session + [5] * 32, TURN) == (home, "sticky")
            path.write_text("- url: [unclosed\n")  # an editor's half-written save
            await eventually(
                lambda: total(scrape(r), "smetric_discovery_errors_total", kind="parse") == 1,
                "the parse error counted",
            )
            assert await worker_set(http, r) == {home}
            path.write_text(f"- {c}\n")  # the entry changed to another worker
            await until_workers(http, r, {c}, "the entry changed")
            text = scrape(r)
            assert total(text, "smetric_discovery_workers_added_total", reason="file_entry") == 3
            assert total(text, "smetric_discovery_workers_removed_total") == 2
