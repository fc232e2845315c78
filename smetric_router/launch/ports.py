"""Free local ports, chosen together so none is handed out twice."""

from __future__ import annotations

import socket
from collections.abc import Iterator


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n distinct free ports, held together while chosen so none is handed out twice."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
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
