"""Free local ports, chosen together so none is handed out twice.

Ports are picked below the kernel's ephemeral range (net.ipv4.ip_local_port_range), where
outgoing connections take their local ports: a port chosen here and bound by a child a moment
later cannot be taken in between by some process's client socket, only by another listener.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator
from pathlib import Path

LOW = 10_000  # below: well-known and registered services' usual homes
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default 32768 elsewhere)."""
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n distinct free ports, held together while chosen so none is handed out twice."""
    high = ephemeral_low()
    socks: list[socket.socket] = []
    try:
        if high - LOW >= 4 * n:
            candidates = random.sample(range(LOW, high), min(high - LOW, 64 * n + 256))
            for port in candidates:
                if len(socks) == n:
                    break
                s = socket.socket()
                try:
                    s.bind((host, port))
                except OSError:
                    s.close()
                    continue
                socks.append(s)
        while len(socks) < n:  # no room below the ephemeral range: let the kernel choose
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def port_source(base_port: int, n: int, avoid: int) -> Iterator[int]:
    """n ports: consecutive from base_port, else free ones (never `avoid`, the router's port)."""
    if base_port:
        return iter(range(base_port, base_port + n))
    return iter([p for p in free_ports(n + 1) if p != avoid][:n])
