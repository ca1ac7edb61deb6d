"""Running the gateway: uvicorn with uvloop and httptools, access log off."""

from __future__ import annotations

import uvicorn

from gateway.app import create_app
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
    """Serve the HTTP gateway until interrupted (``plaza gateway``)."""
    uvicorn.Server(server_config(settings)).run()
