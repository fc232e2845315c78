"""Emulated SGLang workers on loopback addresses of their own (127.0.0.2, 127.0.0.3, ...), all
on one port: what pods look like to a router that discovers them (one --service-discovery-port,
one IP each). Linux answers on the whole of 127.0.0.0/8, so no interface needs setting up."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.reported import reported

MODEL = "qwen3-coder-30b-a3b-emulated"
PAGE_SIZE = 16


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def emulators_on(
    hosts: Sequence[str], port: int, tmp: Path, speedup: float = 20.0
) -> Iterator[dict[str, str]]:
    """One emulated worker per host on `port`; yields host -> its base URL."""
    with contextlib.ExitStack() as stack:
        urls: dict[str, str] = {}
        for host in hosts:
            args = ["smetric_router.emulator", "--host", host, "--port", str(port),
                    "--kv-events-port", "0", "--kv-events-replay-port", "0",
                    "--model-name", MODEL, "--page-size", str(PAGE_SIZE),
                    "--speedup", str(speedup), "--log-level", "warning"]  # fmt: skip
            ports = stack.enter_context(reported(args, tmp / f"emulator-{host}.json"))
            assert ports["http"] == port, ports
            urls[host] = f"http://{host}:{port}"
        yield urls
