"""Running the gateway: the HTTP front (uvicorn, httptools, access log off) and the gRPC
front (grpc.aio) on one event loop, over one ``GatewayService``."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import uvicorn
import uvloop

from plaza.gateway.app import create_app
from plaza.gateway.grpc_front import create_server
from plaza.gateway.metrics import serve_metrics
from plaza.gateway.service import GatewayService
from plaza.gateway.tls import tls_files, uvicorn_tls
from plaza.settings import GatewaySettings, PlazaSettings

log = logging.getLogger(__name__)

GRPC_STOP_GRACE_S = 5.0
"""On shutdown, gRPC calls in flight get this long to finish."""


def server_config(settings: PlazaSettings, service: GatewayService | None = None) -> uvicorn.Config:
    """The uvicorn configuration of the HTTP front (tests serve it on their own socket)."""
    gw = settings.gateway
    return uvicorn.Config(
        create_app(settings, service),
        host=gw.host,
        port=gw.http_port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level=settings.log_level.lower(),
        **uvicorn_tls(tls_files(gw)),
    )


class _HttpServer(uvicorn.Server):
    """uvicorn's server with an event for "started" (uvicorn only has a flag)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.up = asyncio.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self.up.set()


@dataclass(frozen=True, slots=True)
class Serving:
    """A running gateway: where it answers, and the HTTP server's task (it ends on
    SIGINT/SIGTERM, which uvicorn handles)."""

    http_url: str
    grpc_address: str
    service: GatewayService
    config: uvicorn.Config
    http_task: asyncio.Task[None]


@contextlib.asynccontextmanager
async def serving(
    settings: PlazaSettings, http_socket: socket.socket | None = None, grpc_port: int | None = None
) -> AsyncIterator[Serving]:
    """Both fronts, started, until the block ends (then gRPC drains and HTTP stops).

    The HTTP front's lifespan starts the service; the gRPC front opens only after that,
    so neither answers before the model registry is read. ``http_socket`` and ``grpc_port``
    (0: a free port) override the settings' ports, for tests.
    """
    gw = settings.gateway
    service = GatewayService(settings)
    service.load_repository()  # a bad repository fails here, before anything listens
    config = server_config(settings, service)
    http = _HttpServer(config)
    task = asyncio.create_task(http.serve(sockets=[http_socket] if http_socket else None))
    grpc_server, bound = create_server(
        service, gw.host, gw.grpc_port if grpc_port is None else grpc_port, tls_files(gw)
    )
    try:
        up = asyncio.create_task(http.up.wait())
        await asyncio.wait([up, task], return_when=asyncio.FIRST_COMPLETED)
        up.cancel()
        if not http.started:
            await task  # its startup failed: raise why
            raise RuntimeError("the HTTP front stopped during startup")
        await grpc_server.start()
        port = http_socket.getsockname()[1] if http_socket else gw.http_port
        scheme = "http" if gw.tls_cert_file is None else "https"
        yield Serving(f"{scheme}://{gw.host}:{port}", f"{gw.host}:{bound}", service, config, task)
    finally:
        await grpc_server.stop(GRPC_STOP_GRACE_S)
        http.should_exit = True
        with contextlib.suppress(Exception):
            await task


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
        log.info("gateway: HTTP %s, gRPC %s", running.http_url, running.grpc_address)
        with serve_metrics(running.config.app, settings.gateway):
            await running.http_task


def run_gateway(settings: PlazaSettings) -> None:
    """Serve the gateway, and its metrics on ``metrics_port``, until interrupted."""
    warning = exposure_warning(settings.gateway)
    if warning is not None:
        log.warning(warning)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_serve_until_stopped(settings))
