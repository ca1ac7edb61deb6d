"""Loopback ports: finding free ones, checking that a service's ports are still free."""

from __future__ import annotations

import random
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path

from plaza.stack.errors import ServiceError, ServiceOptionError

HOST = "127.0.0.1"
"""Every service and Plaza process of the stack listens on loopback only."""


LOWEST = 10_000
"""Ports picked at random start here (the well-known and dev services' ports lie below)."""
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port(preferred: int | None = None, count: int = 1) -> int:
    """First port of ``count`` consecutive free TCP ports on 127.0.0.1.

    ``preferred`` when that whole block is free, else a block picked at random below the
    kernel's ephemeral range: the kernel never gives those ports to outgoing connections, so
    a block found free stays free while a service starts (a Kafka node takes seconds, and
    the clients around it open connections meanwhile; a block inside the range once lost a
    port to one, and the node failed to bind). Where the range leaves no room below it, a
    block starting at a port the OS hands out. Free means bindable with SO_REUSEADDR, as
    the servers bind.
    """
    if preferred is not None and ports_free(preferred, count):
        return preferred
    low = ephemeral_low()
    picker = random.Random()
    if low - count > LOWEST:
        for _ in range(200):
            start = picker.randrange(LOWEST, low - count)
            if ports_free(start, count):
                return start
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            start = int(sock.getsockname()[1])
        if start + count <= 65535 and ports_free(start, count):
            return start
    raise ServiceError(f"found no block of {count} free ports on {HOST}")


def ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range (Linux's default, 32768, elsewhere)."""
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


MAX_PORT = 65535


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
    """Raise :class:`ServiceError` naming ``what`` if any of ``ports`` is taken, or is not
    a TCP port at all."""
    wrong = [port for port in ports if not 0 < port <= MAX_PORT]
    if wrong:
        raise ServiceError(f"{what}: port(s) {wrong} are not TCP ports (1 to {MAX_PORT})")
    taken = [port for port in ports if not port_free(port)]
    if taken:
        raise ServiceError(f"{what}: port(s) {taken} on {HOST} already in use")


def check_ports(owners: Mapping[str, Sequence[int]]) -> None:
    """:class:`ServiceOptionError` if a port is not a TCP port, or if two owners (options,
    named by the keys) would use the same port; both checked before anything starts."""
    every = [(owner, port) for owner, ports in owners.items() for port in ports]
    wrong = [f"{owner} {port}" for owner, port in every if not 0 < port <= MAX_PORT]
    if wrong:
        raise ServiceOptionError(f"not a TCP port (1 to {MAX_PORT}): {', '.join(wrong)}")
    first_owner: dict[int, str] = {}
    clashes: dict[str, None] = {}  # ordered, without repeats
    for owner, port in every:
        other = first_owner.setdefault(port, owner)
        if other != owner:
            clashes[f"{other} and {owner} both use port {port}"] = None
    if clashes:
        raise ServiceOptionError("; ".join(clashes))


def accepts(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((HOST, port)) == 0
