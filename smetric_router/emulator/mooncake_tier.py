"""The emulated worker's global tier on a real Mooncake store, used as SGLang's HiCache L3 uses it.

Every page goes into the store under SGLang's own keys (MooncakeStore, MHA, TP rank 0):
`{served model name, '/' -> '-'}_{sha256 chain digest hex}_0_k` and `_v`, one object each; a page
counts as stored when both exist. Whoever asks the master with SGLang's keys (the router's L3
view, a pure client) sees an emulated worker's pages exactly as a real worker's. The objects carry
`payload_bytes` each instead of the page's real KV: the transfer time stays the engine's model.

The engine asks its tier synchronously inside a step, and Mooncake calls block (0.1-5 ms; ~4.3 s
each while the master is down), so no call runs on the event loop:
- a request's arrival (`arrive`, awaited before it enters the engine) asks the store which of its
  prompt's pages exist, as SGLang's HiCache asks at arrival to prefetch; queries of requests that
  arrive together go in one `batch_is_exist` on a query thread, and a request waits at most
  `query_timeout_s` for its answer (else it is served as a miss);
- the engine's `peek` / `lookup` then answer from those answers; a lookup's hit pages are read
  back (`get_batch`) and `store`'s pages written (`batch_is_exist`, then `put_batch` of the
  missing, as SGLang's batch_set does) on one I/O thread, in the background;
- a watcher thread follows `health_check()`. While the master is unreachable (health != 0 or a
  call's -900) the tier is a miss for serving and drops writes, as SGLang's wrappers turn an
  outage into misses; one log line per change of state. A restarted master holds nothing.

The int64 page hashes the engine uses cannot be turned back into SHA-256 digests, so each request
registers its pages' digests on arrival (prompt and answer: the answer is known up front) and
drops them when the runner forgets it (`depart`); shared prefixes are counted, not copied.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from smetric_router.core.flags import Flag, option
from smetric_router.core.mooncake_keys import key_prefix, page_keys
from smetric_router.core.prefix import leading_run
from smetric_router.emulator.l3_events import L3Announcer, Page
from smetric_router.features.hashing import block_hash, page_digests

log = logging.getLogger(__name__)
_T = TypeVar("_T")

STORAGE_BACKEND = "MooncakeStore"  # what SGLang's cached_tokens_details calls the backend
RPC_FAIL = -900  # Mooncake's error code for a master it cannot reach
LOCAL_BUFFER_BYTES = 16 << 20  # SGLang's DEFAULT_LOCAL_BUFFER_SIZE
PUT_CHUNK_KEYS = 128  # a put_batch is all or nothing: a full store fails it whole
MAX_PENDING_KEYS = 1 << 16  # writes and reads queued on the I/O thread; beyond: dropped
MAX_KNOWN_PAGES = 1 << 18  # query answers kept for peek / lookup (most recent)
CLOSE_WAIT_S = 12.0  # for a call in flight at close (a dead master's take ~4.3 s)


class TierError(RuntimeError):
    """The tier cannot start: no Mooncake client, no master, or a failed setup."""


# The emulated worker's argument group of the tier's flags.
FLAG_GROUP = "global KV tier"


@dataclass(frozen=True, slots=True)
class TierOptions:
    """The emulator's own settings for the tier (its CLI flags)."""

    # bytes per stored object (page x K/V), not the page's real KV
    payload_bytes: int = option(
        4096,
        Flag(
            "--mooncake-payload-bytes",
            "bytes stored per page and K/V object (scaled down: the fetch time is modelled)",
            group=FLAG_GROUP,
        ),
    )
    query_timeout_s: float = option(
        0.5,
        Flag(
            "--mooncake-query-timeout-secs",
            "the longest a request waits for the store to say which of its pages it holds "
            "(then it is served as a miss)",
            group=FLAG_GROUP,
        ),
    )
    connect_timeout_s: float = option(
        60.0,
        Flag(
            "--mooncake-connect-timeout-secs",
            "start-up fails when the master's RPC port does not answer within this",
            group=FLAG_GROUP,
        ),
    )
    l3_kv_events: bool = option(
        False,
        Flag(
            "--l3-kv-events",
            "publish KV events with medium EXTERNAL for the pages written to the store, and "
            "their removal when this worker clears it, as SGLang with smetric's l3-events patch "
            "does (stock SGLang 0.5.23 publishes none): what a router's --l3-view events reads. "
            "Needs KV events and --global-tier mooncake",
            group=FLAG_GROUP,
        ),
    )
    health_interval_s: float = 0.5


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """The Mooncake client settings SGLang's MooncakeStore reads from the environment
    (MooncakeStoreConfig.load_from_env), with SGLang's defaults."""

    master: str  # MOONCAKE_MASTER, host:port of the master's RPC
    metadata_server: str = "P2PHANDSHAKE"  # MOONCAKE_TE_META_DATA_SERVER
    protocol: str = "rdma"  # MOONCAKE_PROTOCOL
    device: str = ""  # MOONCAKE_DEVICE
    global_segment_size: int = 4 << 30  # MOONCAKE_GLOBAL_SEGMENT_SIZE: what this worker lends
    local_hostname: str = "localhost"  # MOONCAKE_LOCAL_HOSTNAME (or LOCAL_HOSTNAME)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> ClientConfig:
        master = env.get("MOONCAKE_MASTER")
        if not master:
            raise TierError("--global-tier mooncake needs MOONCAKE_MASTER (the master's host:port)")
        d = cls(master)
        return cls(
            master=master,
            metadata_server=env.get("MOONCAKE_TE_META_DATA_SERVER", d.metadata_server),
            protocol=env.get("MOONCAKE_PROTOCOL", d.protocol),
            device=env.get("MOONCAKE_DEVICE", d.device),
            global_segment_size=parse_segment_size(env.get("MOONCAKE_GLOBAL_SEGMENT_SIZE", "4gb")),
            local_hostname=env.get("MOONCAKE_LOCAL_HOSTNAME")
            or env.get("LOCAL_HOSTNAME")
            or d.local_hostname,
        )


def parse_segment_size(value: str) -> int:
    """SGLang's rule: "<N>gb" or a plain number of bytes ("256mb" is an error there too)."""
    s = value.strip().lower()
    try:
        return int(s[:-2]) << 30 if s.endswith("gb") else int(s)
    except ValueError:
        raise TierError(
            f"MOONCAKE_GLOBAL_SEGMENT_SIZE={value!r}: give '<N>gb' or a number of bytes"
        ) from None


class StoreClient(Protocol):
    """The part of mooncake.store.MooncakeDistributedStore the tier uses."""

    def batch_is_exist(self, keys: list[str]) -> list[int]: ...

    def put_batch(self, keys: list[str], values: list[bytes]) -> int: ...

    def get_batch(self, keys: list[str]) -> list[bytes]: ...

    def health_check(self) -> int: ...

    def remove_all(self) -> int: ...

    def close(self) -> int: ...


def connect(cfg: ClientConfig, timeout_s: float) -> StoreClient:
    """A Mooncake client mounted on the master, lending cfg.global_segment_size as a worker does.
    Raises TierError, within about timeout_s, when that cannot be done: Mooncake's own setup
    retries a dead master for ~90 s, so the master's RPC port is awaited first."""
    try:
        from mooncake.store import MooncakeDistributedStore
    except (ImportError, OSError) as exc:
        raise TierError(
            "--global-tier mooncake needs Mooncake's store client: pip install -e '.[mooncake]' "
            f"(its library needs libibverbs1): {exc}"
        ) from exc
    _wait_for_port(cfg.master, timeout_s)
    store: Any = MooncakeDistributedStore()
    rc = store.setup(cfg.local_hostname, cfg.metadata_server, cfg.global_segment_size,
                     LOCAL_BUFFER_BYTES, cfg.protocol, cfg.device, cfg.master)  # fmt: skip
    if rc != 0:
        raise TierError(f"Mooncake setup against the master at {cfg.master} failed (rc {rc})")
    # SGLang's start-up check, and its footprint in the store: one 4 KiB warm-up object
    key = f"sglang_mooncake_store_warmup_key{uuid.uuid4().hex}"
    deadline = time.monotonic() + timeout_s
    while (rc := store.put(key, bytes(4096))) != 0:
        if time.monotonic() > deadline:
            raise TierError(f"Mooncake warm-up put to {cfg.master} failed (rc {rc})")
        time.sleep(0.2)
    client: StoreClient = store
    return client


def _wait_for_port(address: str, timeout_s: float) -> None:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise TierError(f"MOONCAKE_MASTER={address!r}: expected host:port")
    deadline = time.monotonic() + timeout_s
    logged = False
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise TierError(
                    f"the Mooncake master at {address} is not reachable after {timeout_s:g} s "
                    f"({exc}); start mooncake_master first (MOONCAKE_MASTER names it)"
                ) from exc
            if not logged:
                log.info("waiting for the Mooncake master at %s", address)
                logged = True
            time.sleep(0.2)


@dataclass(slots=True)
class _Query:
    keys: list[str]
    future: asyncio.Future[list[int] | None]
    loop: asyncio.AbstractEventLoop


@dataclass(slots=True)
class TierStats:
    """Counters, for /server_info and tests (objects: a page is two, its K and its V)."""

    queries: int = 0  # requests whose prompt pages the store was asked about
    query_timeouts: int = 0  # requests served as misses: no answer in time (or still stuck)
    objects_written: int = 0  # objects this worker put
    objects_dropped: int = 0  # objects not written: store unreachable or full, or backlog
    objects_read_failed: int = 0  # objects of hit pages that did not come back
    pending_keys: int = 0  # keys queued on the I/O thread


class MooncakeTier:
    """The engine's global tier (engine.global_tier.KvTier) on a real Mooncake store, and the
    runner's arrival hook (emulator.runner.Arrivals)."""

    storage_backend = STORAGE_BACKEND

    def __init__(
        self,
        store: StoreClient,
        model_name: str,
        page_size: int,
        options: TierOptions = TierOptions(),
        where: str = "",
    ) -> None:
        self._store = store
        self._prefix = key_prefix(model_name)
        self._page_size = page_size
        self._options = options
        self._where = where or "the Mooncake master"
        self._payload = bytes(options.payload_bytes)
        # hash -> digest of pages of requests in flight, counted per request holding them
        self._digests: dict[int, bytes] = {}
        self._parents: dict[int, int | None] = {}  # the page before, in the token chain
        self._refs: dict[int, int] = {}
        self._by_rid: dict[str, list[int]] = {}
        self._known: dict[int, None] = {}  # pages the store had when last asked, oldest first
        # --l3-kv-events: set by the server once it has a publisher; used on the I/O thread
        self.announcer: L3Announcer | None = None
        self._up = True
        self._state_lock = threading.Lock()
        self._stats_lock = threading.Lock()  # the stats are counted on several threads
        self.stats = TierStats()
        self._queries: list[_Query] = []
        self._asking_since: float | None = None  # when the query thread's current call began
        self._wake = threading.Condition()
        self._stop = threading.Event()
        self._probe_key = f"{self._prefix}_smetric_emulator_probe"
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._answer_queries, name="mooncake-query", daemon=True),
            threading.Thread(target=self._watch, name="mooncake-watch", daemon=True),
            threading.Thread(target=self._run_jobs, name="mooncake-io", daemon=True),
        ]
        for t in self._threads:
            t.start()

    @property
    def up(self) -> bool:
        """Whether the master answers (False: serving from local tiers only)."""
        return self._up

    # ---- the runner's hooks (event loop) ------------------------------------------------------

    async def arrive(self, rid: str, input_ids: list[int], output_ids: Sequence[int]) -> None:
        """Register the request's pages and learn which of its prompt's pages the store holds."""
        ps = self._page_size
        digests = page_digests([*input_ids, *output_ids], ps)
        hashes = [block_hash(d) for d in digests]
        self._register(rid, hashes, digests)
        n = min((len(input_ids) - 1) // ps, len(digests))  # SGLang computes the last token
        if n <= 0 or not self._up:
            return
        stuck = self._asking_since
        if stuck is not None and time.monotonic() - stuck > self._options.query_timeout_s:
            # a hung master can keep health_check at 0: don't make every request wait for it
            self._count("query_timeouts", 1)
            return
        keys = [k for d in digests[:n] for k in page_keys(self._prefix, d)]
        loop = asyncio.get_running_loop()
        query = _Query(keys, loop.create_future(), loop)
        with self._wake:
            self._queries.append(query)
            self._wake.notify()
        self._count("queries", 1)
        try:
            exist = await asyncio.wait_for(
                asyncio.shield(query.future), self._options.query_timeout_s
            )
        except asyncio.TimeoutError:
            self._count("query_timeouts", 1)
            return
        if exist is None:
            return
        known = self._known
        for i, h in enumerate(hashes[:n]):
            if exist[2 * i] == 1 and exist[2 * i + 1] == 1:
                known.pop(h, None)
                known[h] = None
            else:
                known.pop(h, None)
        while len(known) > MAX_KNOWN_PAGES:
            del known[next(iter(known))]

    def depart(self, rid: str) -> None:
        hashes = self._by_rid.pop(rid, None)
        if hashes is None:
            return
        refs, digests, parents = self._refs, self._digests, self._parents
        for h in hashes:
            n = refs[h] - 1
            if n:
                refs[h] = n
            else:
                del refs[h], digests[h], parents[h]

    def _register(self, rid: str, hashes: list[int], digests: list[bytes]) -> None:
        self.depart(rid)
        self._by_rid[rid] = hashes
        refs, known_digests, parents = self._refs, self._digests, self._parents
        before: int | None = None
        for h, d in zip(hashes, digests, strict=True):
            n = refs.get(h, 0)
            if not n:
                known_digests[h] = d
                parents[h] = before  # a chain hash names its parent: the same in every chain
            refs[h] = n + 1
            before = h

    # ---- the engine's tier (event loop, inside a step) ----------------------------------------

    def peek(self, page_hashes: Sequence[int]) -> int:
        if not self._up:
            return 0
        return leading_run(self._known, page_hashes)

    def lookup(self, page_hashes: Sequence[int]) -> int:
        n = self.peek(page_hashes)
        if n:
            keys = self._keys(page_hashes[:n])
            if keys and self._reserve(len(keys)):
                self._jobs.put(functools.partial(self._read, keys))
        return n

    def store(self, page_hashes: Sequence[int]) -> None:
        keys = self._keys(page_hashes)
        if not keys:
            return
        if not self._up or not self._reserve(len(keys)):
            self._count("objects_dropped", len(keys))
            return
        pages: list[Page] = []
        if self.announcer is not None:  # in the order _keys() lists their keys
            pages = [(h, self._parents[h]) for h in page_hashes if h in self._digests]
        self._jobs.put(functools.partial(self._write, keys, pages))

    def _keys(self, page_hashes: Sequence[int]) -> list[str]:
        digests = self._digests
        return [
            k for h in page_hashes if (d := digests.get(h)) is not None
            for k in page_keys(self._prefix, d)
        ]  # fmt: skip

    def _reserve(self, n: int) -> bool:
        with self._stats_lock:
            if self.stats.pending_keys + n > MAX_PENDING_KEYS:
                return False
            self.stats.pending_keys += n
            return True

    def _count(self, name: str, n: int) -> None:
        with self._stats_lock:
            setattr(self.stats, name, getattr(self.stats, name) + n)

    async def clear(self) -> bool:
        """Empty the whole store, as SGLang's POST /hicache/storage-backend/clear does with its
        Mooncake backend (remove_all: every worker's pages, the store is shared). Runs on the I/O
        thread, after the writes queued before it; False when the master does not do it."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bool] = loop.create_future()

        def job() -> None:
            try:
                ok = self._up and self._store.remove_all() >= 0
            except Exception as exc:
                log.debug("Mooncake remove_all raised: %s", exc)
                ok = False
            if ok and self.announcer is not None:
                self.announcer.cleared()
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(_settle, done, ok)

        self._jobs.put(job)
        ok = await done
        if ok:
            self._known = {}  # rebound, not cleared: the query thread may be reading it
        return ok

    # ---- Mooncake calls (worker threads) ------------------------------------------------------

    def _run_jobs(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()

    def _answer_queries(self) -> None:
        while True:
            with self._wake:
                while not self._queries and not self._stop.is_set():
                    self._wake.wait()
                if self._stop.is_set():
                    return
                batch, self._queries = self._queries, []
            self._asking_since = time.monotonic()
            answer = self._exist([k for q in batch for k in q.keys]) if self._up else None
            self._asking_since = None
            at = 0
            for q in batch:
                part = None if answer is None else answer[at : at + len(q.keys)]
                at += len(q.keys)
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    q.loop.call_soon_threadsafe(_settle, q.future, part)

    def _exist(self, keys: list[str]) -> list[int] | None:
        """batch_is_exist, or None when the store did not answer (then marked down on -900)."""
        try:
            exist = self._store.batch_is_exist(keys)
        except Exception as exc:  # a client error is a miss, not a crash
            log.debug("Mooncake batch_is_exist raised: %s", exc)
            return None
        if len(exist) != len(keys) or any(e < 0 for e in exist):
            if RPC_FAIL in exist:
                self._set_up(False, f"rc {RPC_FAIL}")
            return None
        return list(exist)

    def _write(self, keys: list[str], pages: Sequence[Page] = ()) -> None:
        """Put the keys the store lacks; with pages (--l3-kv-events), announce those whose
        every key it holds afterwards."""
        held: list[bool] = []
        try:
            exist = self._exist(keys) if self._up and not self._stop.is_set() else None
            if exist is None:
                self._count("objects_dropped", len(keys))
                return
            held = [e == 1 for e in exist]
            missing = [i for i, h in enumerate(held) if not h]
            for at in range(0, len(missing), PUT_CHUNK_KEYS):
                chunk = missing[at : at + PUT_CHUNK_KEYS]
                rc = self._put([keys[i] for i in chunk])
                if rc == 0:
                    self._count("objects_written", len(chunk))
                    for i in chunk:
                        held[i] = True
                    continue
                self._count("objects_dropped", len(missing) - at)
                if rc == RPC_FAIL:
                    self._set_up(False, f"put rc {rc}")
                    return
                log.debug("Mooncake put_batch of %d keys failed: rc %d", len(chunk), rc)
        finally:
            self._count("pending_keys", -len(keys))
            if pages and held and self.announcer is not None:
                per = len(keys) // len(pages)
                ok = [all(held[i * per : (i + 1) * per]) for i in range(len(pages))]
                self.announcer.stored(pages, ok)

    def _put(self, keys: list[str]) -> int:
        try:
            return self._store.put_batch(keys, [self._payload] * len(keys))
        except Exception as exc:
            log.debug("Mooncake put_batch raised: %s", exc)
            return -1

    def _read(self, keys: list[str]) -> None:
        """Read a hit back, as SGLang prefetches it (the time it takes is the engine's model)."""
        try:
            if not self._up or self._stop.is_set():
                return
            try:
                values = self._store.get_batch(keys)
            except Exception as exc:
                log.debug("Mooncake get_batch raised: %s", exc)
                values = []
            got = sum(1 for v in values if v)
            self._count("objects_read_failed", len(keys) - got)
        finally:
            self._count("pending_keys", -len(keys))

    def _watch(self) -> None:
        while not self._stop.wait(self._options.health_interval_s):
            try:
                health = self._store.health_check()
            except Exception:
                health = -1
            if self._up and health != 0:
                self._set_up(False, f"health_check {health}")
            # health_check still says 0 for a few seconds after the master died: ask it
            # something before believing it is back
            elif not self._up and health == 0 and self._exist([self._probe_key]) is not None:
                self._set_up(True, "")

    def _set_up(self, up: bool, why: str) -> None:
        with self._state_lock:
            if self._up == up:
                return
            self._up = up
            if not up:
                self._known = {}  # rebound, not cleared: the loop thread may be reading it
        if up:
            log.warning("Mooncake store at %s reachable again; writing to it again", self._where)
        else:
            log.warning(
                "Mooncake store at %s unreachable (%s): serving from local tiers only, "
                "writes dropped", self._where, why,
            )  # fmt: skip

    def close(self) -> None:
        """Stop the threads and unmount this worker's segment (blocks: call it off the loop)."""
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
        self._jobs.put(None)  # queued jobs before it see _stop and drop their keys
        deadline = time.monotonic() + CLOSE_WAIT_S
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in self._threads):
            # closing the client under a call in flight crashes Mooncake (measured: SIGSEGV)
            log.warning("Mooncake calls still in flight at exit: the segment stays mounted")
            return
        with contextlib.suppress(Exception):
            self._store.close()


def _settle(future: asyncio.Future[_T], value: _T) -> None:
    if not future.done():
        future.set_result(value)


async def open_tier(
    model_name: str,
    page_size: int,
    options: TierOptions = TierOptions(),
    env: Mapping[str, str] = os.environ,
) -> MooncakeTier:
    """A tier on the master the MOONCAKE_* environment names, connected off the event loop."""
    cfg = ClientConfig.from_env(env)
    store = await asyncio.to_thread(connect, cfg, options.connect_timeout_s)
    log.info("global tier: Mooncake store at %s (%s)", cfg.master, cfg.protocol)
    return MooncakeTier(store, model_name, page_size, options, cfg.master)
