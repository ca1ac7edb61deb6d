"""Running the gateway: uvicorn with uvloop and httptools, access log off."""

from __future__ import annotations

import uvicorn

from plaza.gateway.app import create_app
from plaza.gateway.metrics import serve_metrics
from plaza.settings import PlazaSettings


def server_config(settings: PlazaSettings) -> uvicorn.Config:
    """The uvicorn configuration the gateway runs with (tests serve it on their own socket)."""
    gw = settings.gateway
    return uvicorn.Config(
        create_app(settings),
        host=gw.host,
        port=gw.http_port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level=settings.log_level.lower(),
    )


def run_gateway(settings: PlazaSettings) -> None:
    """Serve the HTTP gateway, and its metrics on ``metrics_port``, until interrupted."""
    config = server_config(settings)
    with serve_metrics(config.app, settings.gateway):
        uvicorn.Server(config).run()
