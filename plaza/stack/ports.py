"""Loopback ports: finding free ones, checking that a service's ports are still free."""

from __future__ import annotations

import socket
from collections.abc import Sequence

from plaza.stack.errors import ServiceError

HOST = "127.0.0.1"
"""Every service and Plaza process of the stack listens on loopback only."""


def free_port(preferred: int | None = None, count: int = 1) -> int:
    """First port of ``count`` consecutive free TCP ports on 127.0.0.1.

    ``preferred`` when that whole block is free, else a block starting at a port the OS
    hands out. Free means bindable with SO_REUSEADDR, as the servers bind.
    """
    if preferred is not None and ports_free(preferred, count):
        return preferred
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            start = int(sock.getsockname()[1])
        if start + count <= 65535 and ports_free(start, count):
            return start
    raise ServiceError(f"found no block of {count} free ports on {HOST}")


def ports_free(start: int, count: int = 1) -> bool:
    """Whether ``start .. start + count - 1`` are all bindable on 127.0.0.1."""
    return all(port_free(port) for port in range(start, start + count))


def port_free(port: int) -> bool:
    """Whether ``port`` is bindable on 127.0.0.1 (with SO_REUSEADDR, as servers bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def require_free(ports: Sequence[int], what: str) -> None:
    """Raise :class:`ServiceError` naming ``what`` if any of ``ports`` is taken."""
    taken = [port for port in ports if not port_free(port)]
    if taken:
        raise ServiceError(f"{what}: port(s) {taken} on {HOST} already in use")


def accepts(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((HOST, port)) == 0
