"""``plaza worker``: run one worker process until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal

from plaza.settings import PlazaSettings
from plaza.workers.backends import onnx
from plaza.workers.worker import Worker


async def serve(settings: PlazaSettings) -> None:
    """Start a worker, serve until a stop signal, then drain and stop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    worker = Worker(settings)
    await worker.start()
    await worker.run_until_stopped(stop)


def run_worker(settings: PlazaSettings) -> None:
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    onnx.configure(settings.worker)
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(settings))
    else:
        uvloop.run(serve(settings))
