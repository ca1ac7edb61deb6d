"""Fault 1: kill -9 one of two workers of a consumer group in the middle of the load.

What it shows: the records the dead worker had fetched but not committed are replayed by
the survivor once the group notices (session timeout), and every request is still answered
exactly once: the result keys hold one correct answer per correlation id, and the result
stream holds no second entry for any id (first write wins, the stream is written only on a
first write).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
import redis.asyncio

from plaza.client import PlazaClient
from tests.faults.harness import (
    Deployment,
    FaultReport,
    Load,
    Processes,
    ResultTail,
    audit,
    wait_assignment,
    wait_drained,
    wait_for,
)

REQUESTS = 3000


@pytest.mark.timeout(150)
async def test_worker_killed_mid_flight(
    deployment: Deployment,
    processes: Processes,
    redis_for: Callable[[str], redis.asyncio.Redis],
    record_fault: Callable[[FaultReport], None],
) -> None:
    r = redis_for(deployment.redis_url)
    victim, survivor = processes.worker(deployment, "a"), processes.worker(deployment, "b")
    await asyncio.gather(victim.wait_registered(r, deployment.names),
                         survivor.wait_registered(r, deployment.names))
    await wait_assignment([victim, survivor], deployment.partitions)

    async with PlazaClient(deployment.settings()) as client:
        stream = client.results_stream("fault-worker-kill")
        tail = ResultTail(deployment.redis_url, stream).start()
        load = Load(client, stream, REQUESTS, rate=1e6, chunk=500)
        try:
            # Every request is in Kafka and the victim is busy with its share: kill it now.
            await load.run()
            await wait_for(lambda: tail.by_worker[victim.worker_id] >= 20, 60,
                           "the victim's first answers", victim.tail)
            victim.check_alive()
            victim.kill9()
            fault_at = time.monotonic()
            await wait_for(lambda: tail.answered >= REQUESTS, 90, "every answer",
                           lambda: f"{tail.answered}/{REQUESTS} answered\n{survivor.tail()}")
            await wait_drained(deployment)
        finally:
            await tail.stop()
        survivor.check_alive()

    report = await audit(
        "worker_kill", r, deployment.names, load.expected, stream,
        tail.recovery_s(load, fault_at),
        open_at_kill=tail.open_at(load, fault_at), by_victim=tail.by_worker[victim.worker_id],
        by_survivor=tail.by_worker[survivor.worker_id], resent=load.resent,
    )
    record_fault(report)
    assert report.details["open_at_kill"] > 0, "the kill came after the load: nothing was in flight"
    report.check()
