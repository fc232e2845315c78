"""--discovery-provider file: workers listed in a JSON or YAML file, re-read when it changes.

The file holds a list (or {"workers": [...]}) of entries, each a URL or an object
{"url": ..., "role": "prefill" | "decode", "bootstrap_port": N}; `role` is needed under PD
disaggregation and refused without it. The file is read on every poll and compared by content,
not by mtime alone: two edits within the file system's timestamp granularity look the same by
mtime. A file that does not parse changes nothing: the last good list stays registered (and
the error is counted and logged once), since an editor's half-written save must not empty the
cluster.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from smetric_router.discovery.base import Apply, Discovered, Wanted, diff
from smetric_router.discovery.metrics import DiscoveryMetrics
from smetric_router.router.workers import Role, WorkerSpec, normalize_url

log = logging.getLogger(__name__)

ADDED_REASON = "file_entry"


class FileFormatError(ValueError):
    """The discovery file is not a list of workers this router can take."""


@dataclass(frozen=True, slots=True)
class FileSettings:
    path: Path
    pd: bool = False  # entries carry a role (prefill/decode) under PD disaggregation
    interval_secs: float = 1.0


def _entry(item: Any, n: int, pd: bool, name: str) -> Discovered:
    where = f"{name} entry {n}"
    if isinstance(item, str):
        item = {"url": item}
    if not isinstance(item, dict):
        raise FileFormatError(f"{where}: expected a URL or an object with 'url'")
    unknown = set(item) - {"url", "role", "bootstrap_port"}
    if unknown:
        raise FileFormatError(f"{where}: unknown keys {sorted(unknown)}")
    url, role, port = item.get("url"), item.get("role"), item.get("bootstrap_port")
    if not isinstance(url, str):
        raise FileFormatError(f"{where}: 'url' (string) is required")
    allowed = ("prefill", "decode") if pd else (None, "worker")
    if role not in allowed:
        want = "'prefill' or 'decode' (PD disaggregation)" if pd else "absent (colocated)"
        raise FileFormatError(f"{where}: 'role' must be {want}, got {role!r}")
    if port is not None and (type(port) is not int):
        raise FileFormatError(f"{where}: 'bootstrap_port' must be an integer")
    try:
        # the registry keys workers by the normalized URL: removal must find it by that
        spec = WorkerSpec(normalize_url(url), Role(role or "worker"), port)
        return Discovered(spec, where)
    except ValueError as e:
        raise FileFormatError(f"{where}: {e}") from None


def parse_workers(
    text: str, pd: bool = False, name: str = "discovery file"
) -> dict[str, Discovered]:
    """The file's workers by URL (YAML is a superset of JSON, so one parser reads both)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise FileFormatError(
            f"{name} is neither JSON nor YAML: {' '.join(str(e).split())}"
        ) from None
    if isinstance(data, dict) and set(data) == {"workers"}:
        data = data["workers"]
    if data is None:
        data = []
    if not isinstance(data, list):
        raise FileFormatError(f"{name} must hold a list of workers (or {{workers: [...]}})")
    out: dict[str, Discovered] = {}
    for n, item in enumerate(data, 1):
        w = _entry(item, n, pd, name)
        if w.url in out:
            raise FileFormatError(f"{name}: {w.url} is listed twice")
        out[w.url] = w
    return out


class FileProvider:
    name = "file"

    def __init__(self, settings: FileSettings, metrics: DiscoveryMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self._wanted: Wanted = {}
        self._last: bytes | None = None  # the content last looked at, good or bad
        # A change is taken once two polls in a row read it: a save caught half-way (truncated,
        # then written) would otherwise drop every worker for one poll.
        self._pending: bytes | None = None

    async def run(self, apply: Apply) -> None:
        log.info("discovery: watching %s for workers", self.settings.path)
        while True:
            await self.poll(apply)
            await asyncio.sleep(self.settings.interval_secs)

    async def poll(self, apply: Apply) -> None:
        path = self.settings.path
        try:
            raw = await asyncio.to_thread(path.read_bytes)
        except OSError as e:
            if self._last != b"\0unreadable":
                log.error("discovery file %s unreadable (%s); keeping its last workers", path, e)
                self.metrics.error(self.name, "unreadable")
            self._last = b"\0unreadable"
            return
        self.metrics.saw_event(self.name)
        if raw == self._last:
            self._pending = None
            return
        if self._last is not None and raw != self._pending:
            self._pending = raw
            return
        self._last, self._pending = raw, None
        try:
            wanted = parse_workers(raw.decode("utf-8", "replace"), self.settings.pd, path.name)
        except FileFormatError as e:
            log.error("%s; keeping the last workers it listed", e)
            self.metrics.error(self.name, "parse")
            return

        def why(w: Discovered) -> str:
            return "file_changed" if w.url in wanted else "file_removed"

        changes = diff(self._wanted, wanted, why, ADDED_REASON)
        self._wanted = wanted
        if changes:
            await apply(changes)
