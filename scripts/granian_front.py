"""The gateway's HTTP front as a plain ASGI app, for serving it under granian to measure
against uvicorn (``scripts/profile_perf_analyzer.sh`` with ``HTTP_SERVER=granian``).

Only the HTTP front: no gRPC, no metrics port. The app's lifespan starts the service as
under ``plaza gateway``; the collector is tuned the same way. granian is not a Plaza
dependency: install it apart (``pip install --target DIR granian``, then ``PYTHONPATH=DIR``).

    python -m granian --interface asgi --loop uvloop --factory granian_front:app_factory
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from plaza import gc_tuning
from plaza.gateway.app import create_app
from plaza.settings import PlazaSettings


def app_factory() -> ASGIApp:
    """The HTTP front; once its lifespan has started, start-up's objects are frozen."""
    gc_tuning.tune()
    app = create_app(PlazaSettings())

    async def front(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return

        async def send_frozen(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                gc_tuning.freeze_startup()
            await send(message)

        await app(scope, receive, send_frozen)

    return front
