"""``plaza worker``: run one worker process (a host of one or more models) until a signal."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal

from plaza.settings import PlazaSettings
from plaza.workers.host import Host

GC_THRESHOLDS = (20_000, 50, 100)
"""The garbage collector's generation thresholds in a worker process (Python's: 700, 10,
10). A worker makes dozens of container objects per request, so at the default a
young-generation collection ran every few dozen requests under load. Measured in
docs/benchmarks.md (Hot paths, second pass): the worker's CPU per request draining a
backlog fell to 0.86 of the default's."""


async def serve(settings: PlazaSettings) -> None:
    """Start a host, serve until a stop signal, then drain and stop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    host = Host(settings)
    await host.start()
    await host.run_until_stopped(stop)


def run_worker(settings: PlazaSettings) -> None:
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(settings))
    else:
        uvloop.run(serve(settings))
