"""Running the gateway: the HTTP front (``plaza.gateway.http_server``) and the gRPC front
(grpc.aio) on one event loop, over one ``GatewayService``; with ``gateway.workers``
N > 1, N such processes share the HTTP and gRPC ports (``SO_REUSEPORT``: the kernel spreads
new connections over them), started and stopped by this one."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ipaddress
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess

from starlette.applications import Starlette

from plaza import event_loop, gc_tuning
from plaza.connections import kafka_answers
from plaza.errors import EXIT_RETRIABLE, ConfigError, PlazaError
from plaza.gateway.app import api_key, create_app
from plaza.gateway.grpc_front import start_server
from plaza.gateway.http_front import HttpFront
from plaza.gateway.http_server import HttpServer, body_bound_s
from plaza.gateway.metrics import serve_metrics
from plaza.gateway.service import GatewayService
from plaza.gateway.tls import ssl_context, tls_files
from plaza.log_settings import configure_logging
from plaza.settings import GatewaySettings, PlazaSettings

log = logging.getLogger(__name__)

STOP_GRACE_S = 5.0
"""On shutdown, the calls in flight on both fronts get ``sync_timeout_s`` and this long to
finish (a sync call ends within its timeout)."""

WORKER_STOP_MARGIN_S = 5.0
"""With several gateway processes: after SIGTERM each gets the fronts' own grace
(``sync_timeout_s`` + ``STOP_GRACE_S``) and this long more (its clients' close) before
SIGKILL."""

HTTP_BACKLOG = 2048
"""listen() backlog of a shared HTTP socket."""


@dataclass(frozen=True, slots=True)
class Serving:
    """A running gateway: where it answers, its service and its Starlette app."""

    http_url: str
    grpc_address: str
    service: GatewayService
    app: Starlette


@contextlib.asynccontextmanager
async def serving(
    settings: PlazaSettings, http_socket: socket.socket | None = None, grpc_port: int | None = None
) -> AsyncIterator[Serving]:
    """Both fronts, started, until the block ends (then both drain and the service stops).

    The service starts first, so neither front answers before the model registry is read;
    a failed start stops what it had started (its Kafka clients, Redis) before it raises.
    ``http_socket`` (a bound socket) and ``grpc_port`` (0: a free port) override the
    settings' ports, for tests and for several gateway processes on one port.
    """
    gw = settings.gateway
    service = GatewayService(settings)
    service.load_repository()  # a bad repository fails here, before anything listens
    app = create_app(settings, service)
    files = tls_files(gw)
    front = HttpFront(app, api_key(settings), "http" if files is None else "https")
    try:
        with kafka_answers(settings.kafka):  # the producer's or admin client's start
            await service.start()
        http = HttpServer(
            front,
            max_body_bytes=gw.max_body_bytes,
            max_body_s=body_bound_s(gw.max_body_s),
            ssl_context=ssl_context(files),
        )
        port = await http.start(gw.host, gw.http_port, http_socket)
        stops: list[Callable[[float], Awaitable[None]]] = [http.stop]
        try:
            grpc_server, bound = await start_server(
                service, gw.host, gw.grpc_port if grpc_port is None else grpc_port, files
            )
            stops.append(grpc_server.stop)
            scheme = "http" if files is None else "https"
            yield Serving(f"{scheme}://{gw.host}:{port}", f"{gw.host}:{bound}", service, app)
        finally:
            await _stop_together(stops, gw.sync_timeout_s + STOP_GRACE_S)
    finally:
        await service.stop()


async def _stop_together(stops: list[Callable[[float], Awaitable[None]]], grace_s: float) -> None:
    """Stop the fronts at once, each giving its calls in flight ``grace_s``; the first
    failure is raised once all have stopped."""
    outcomes = await asyncio.gather(*(stop(grace_s) for stop in stops), return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome


async def _until_signalled() -> None:
    """Wait for SIGINT or SIGTERM."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


def exposure_warning(gw: GatewaySettings) -> str | None:
    """A warning when the gateway listens beyond loopback without an API key, else None."""
    if gw.api_key is not None or gw.host == "localhost":
        return None
    try:
        if ipaddress.ip_address(gw.host).is_loopback:
            return None
    except ValueError:  # a host name: it may resolve to anything
        pass
    return (
        f"the gateway listens on {gw.host} without gateway.api_key: anyone who reaches it can "
        "run the models (docs/guarantees.md, Security)"
    )


async def _serve_until_stopped(settings: PlazaSettings) -> None:
    async with serving(settings) as running:
        gc_tuning.freeze_startup()
        log.info("gateway: HTTP %s, gRPC %s", running.http_url, running.grpc_address)
        with serve_metrics(running.app, settings.gateway):
            await _until_signalled()


async def _serve_shared_port(settings: PlazaSettings) -> None:
    """One of several gateway processes: its HTTP socket is bound with ``SO_REUSEPORT``."""
    gw = settings.gateway
    with reuse_port_socket(gw.host, gw.http_port) as sock:
        async with serving(settings, http_socket=sock) as running:
            gc_tuning.freeze_startup()
            log.info(
                "gateway process %d: HTTP %s, gRPC %s",
                os.getpid(),
                running.http_url,
                running.grpc_address,
            )
            with serve_metrics(running.app, gw):
                await _until_signalled()


def reuse_port_socket(host: str, port: int, front: str = "HTTP") -> socket.socket:
    """A listening TCP socket on ``host:port`` that other processes may bind as well
    (ConfigError, naming the ``front``, where it cannot)."""
    sock: socket.socket | None = None
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        family, kind, proto, _, address = info
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        sock.listen(HTTP_BACKLOG)
    except OSError as exc:  # the port taken, the host unknown or not this machine's
        if sock is not None:
            sock.close()
        raise ConfigError(f"the {front} front cannot listen on {host}:{port}: {exc}") from exc
    return sock


def _check_ports(settings: PlazaSettings) -> None:
    """ConfigError, once, before any gateway process starts, where the shared ports cannot
    be bound (each process would report it)."""
    gw = settings.gateway
    for front, port in (("HTTP", gw.http_port), ("gRPC", gw.grpc_port)):
        reuse_port_socket(gw.host, port, front).close()


def process_settings(settings: PlazaSettings, index: int) -> PlazaSettings:
    """The settings of gateway process ``index`` of several: its own metrics port
    (``metrics_port + index``) and gateway id (its reply stream).

    ``workers`` stays the deployment's count: the service refuses what one process would
    hold alone (client shared memory, trace settings) by it. A process runs
    ``_gateway_process``, never ``run_gateway``, so it starts no processes of its own.
    """
    gw = settings.gateway
    update: dict[str, object] = {}
    if gw.metrics_port > 0:
        update["metrics_port"] = gw.metrics_port + index
    if gw.gateway_id:
        update["gateway_id"] = f"{gw.gateway_id}-{index}"
    return settings.model_copy(update={"gateway": gw.model_copy(update=update)})


def _pinned_ports(settings: PlazaSettings) -> PlazaSettings:
    """Port 0 (a free one) chosen once, so that every gateway process shares it."""
    gw = settings.gateway
    update = {
        name: _free_port(gw.host) for name in ("http_port", "grpc_port") if getattr(gw, name) == 0
    }
    return settings.model_copy(update={"gateway": gw.model_copy(update=update)})


def _free_port(host: str) -> int:
    try:
        with socket.socket() as s:
            s.bind((host, 0))
            return int(s.getsockname()[1])
    except OSError as exc:
        raise ConfigError(f"the gateway cannot listen on {host}: {exc}") from exc


def _gateway_process(settings: PlazaSettings) -> None:
    """Body of one gateway process (spawned: a fresh interpreter); it dies with its parent."""
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)
    configure_logging(settings.log_level)
    gc_tuning.tune()
    # a Ctrl-C before the signal handlers are set is a normal stop too
    try:
        with contextlib.suppress(KeyboardInterrupt):
            event_loop.run(_serve_shared_port(settings))
    except PlazaError as exc:  # a user error is one line, as `plaza gateway` prints it
        print(f"plaza gateway: error: {exc.message}", file=sys.stderr)
        sys.exit(EXIT_RETRIABLE if exc.retriable else 1)


def run_gateway_processes(settings: PlazaSettings) -> int:
    """``gateway.workers`` gateway processes on shared ports, until SIGINT/SIGTERM (then
    each is stopped: SIGTERM, SIGKILL after a grace period) or until one of them exits
    (then the others are stopped too). Returns the exit status: 0 after a stop signal,
    ``EXIT_RETRIABLE`` when every process that failed did so for a reason that may pass (as
    one gateway process would), else 1."""
    settings = _pinned_ports(settings)
    _check_ports(settings)
    ctx = multiprocessing.get_context("spawn")
    stopping = threading.Event()
    procs: list[BaseProcess] = []
    previous = {
        sig: signal.signal(sig, lambda *_: stopping.set())
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        for i in range(settings.gateway.workers):
            proc = ctx.Process(
                target=_gateway_process,
                args=(process_settings(settings, i),),
                name=f"gateway-{i}",
                daemon=False,
            )
            proc.start()
            procs.append(proc)
        while not stopping.is_set():
            if multiprocessing.connection.wait([p.sentinel for p in procs], timeout=0.5):
                break
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        grace_s = settings.gateway.sync_timeout_s + STOP_GRACE_S + WORKER_STOP_MARGIN_S
        _stop_all(procs, grace_s)
    return processes_status([p.exitcode for p in procs], stopped=stopping.is_set())


def processes_status(exit_codes: list[int | None], *, stopped: bool) -> int:
    """The gateway's exit status from its processes' (``stopped``: after a stop signal):
    0 when none failed after a stop; ``EXIT_RETRIABLE`` when each that failed exited so
    (Kafka or Redis failed it: starting again may work); else 1."""
    failed = [code for code in exit_codes if code not in (0, -signal.SIGTERM)]
    if not failed:
        return 0 if stopped else 1
    return EXIT_RETRIABLE if all(code == EXIT_RETRIABLE for code in failed) else 1


def _stop_all(procs: list[BaseProcess], grace_s: float) -> None:
    """SIGTERM every process, then SIGKILL those still alive ``grace_s`` later (one deadline
    for all: they stop at the same time)."""
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join()


def run_gateway(settings: PlazaSettings) -> int:
    """Serve the gateway, and its metrics on ``metrics_port``, until interrupted
    (``gateway.workers`` > 1: that many processes on shared ports). Returns an exit status."""
    configure_logging(settings.log_level)
    warning = exposure_warning(settings.gateway)
    if warning is not None:
        log.warning(warning)
    if settings.gateway.workers > 1:
        return run_gateway_processes(settings)
    gc_tuning.tune()
    event_loop.run(_serve_until_stopped(settings))
    return 0
