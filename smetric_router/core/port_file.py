"""Port files: how a server started on port 0 tells its launcher which ports the OS gave it.

A process given `--port 0` (and other ports 0) binds, then writes `--port-file PATH`: one JSON
object of names to bound ports, e.g. `{"http": 41873, "kv_events": 41874}`. The file is written
to a temporary name and renamed, so a reader never sees it half written. Binding port 0 and
reporting it leaves no window in which another process can take the port, unlike choosing a free
port, closing it and handing the number to a child.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from aiohttp import web


def write_port_file(path: str | Path, ports: Mapping[str, int]) -> None:
    """Write `ports` to `path` atomically."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(dict(ports), sort_keys=True))
    os.replace(tmp, target)


def read_port_file(path: str | Path) -> dict[str, int] | None:
    """The ports in `path`, or None while it does not exist yet."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    raw = json.loads(text)
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and type(v) is int for k, v in raw.items()
    ):
        raise ValueError(f"{path}: expected a JSON object of names to port numbers, got {text!r}")
    return dict(raw)


def bound_port(runner: web.AppRunner) -> int:
    """The TCP port an aiohttp runner's (first) site listens on."""
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    raise RuntimeError("the server listens on no TCP address")
