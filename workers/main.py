"""``plaza worker``: run one worker process (a host of one or more models) until a signal."""

from __future__ import annotations

import asyncio
import signal

from plaza import event_loop, gc_tuning
from plaza.connections import kafka_answers
from plaza.errors import ConfigError
from plaza.log_settings import configure_logging
from plaza.settings import PlazaSettings
from plaza.workers.host import Host


async def serve(settings: PlazaSettings) -> None:
    """Start a host, serve until a stop signal, then drain and stop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    host = Host(settings)
    name_generation(host, settings.worker.generation)
    # Kafka out of reach: one line for the operator (a failed start stops what it started)
    with kafka_answers(settings.kafka):
        await host.start()
    gc_tuning.freeze_startup()  # the models and clients loaded: keep them out of collections
    await host.run_until_stopped(stop)


def name_generation(host: Host, generation: int | None) -> None:
    """``worker.generation``: the model table's generation that the host's one unit serves,
    named in its registry entry, as a following host names its units' (``plaza up
    --process-per-model``'s supervisor sets it; a load waits for a worker of its
    generation). ConfigError for a host of several models or one following the table."""
    if generation is None:
        return
    if host.follows or len(host.workers) != 1:
        raise ConfigError(
            "worker.generation names the generation of one model: set it on a worker of one "
            "model (--worker.model), not a host of several or one following the model table"
        )
    host.workers[0].generation = generation


def run_worker(settings: PlazaSettings) -> None:
    configure_logging(settings.log_level)
    gc_tuning.tune()
    event_loop.run(serve(settings))
