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
from collections.abc import Callable, Mapping

import pytest
import redis.asyncio
from aiokafka.partitioner import DefaultPartitioner

from plaza.client import PlazaClient
from tests.faults.audit import FaultReport, audit, wait_all_answered
from tests.faults.harness import Deployment, wait_for
from tests.faults.processes import Processes, wait_assignment
from tests.faults.traffic import Load, ResultTail

REQUESTS = 3000
PARTITIONER = DefaultPartitioner()


def taken_over(
    sent_at: Mapping[str, float],
    first_seen: Mapping[str, float],
    victim_partitions: set[int],
    partitions: int,
    fault_at: float,
) -> int:
    """Requests on the victim's partitions answered only after it died (by the survivor).

    The partition is the producer's own choice for the key (the correlation id).
    """
    every = list(range(partitions))
    return sum(
        1
        for rid in sent_at
        if PARTITIONER(rid.encode(), every, every) in victim_partitions
        and first_seen.get(rid, float("inf")) > fault_at
    )


@pytest.mark.timeout(150)
async def test_worker_killed_mid_flight(
    deployments: Callable[..., Deployment],
    processes: Processes,
    redis_for: Callable[[str], redis.asyncio.Redis],
    record_fault: Callable[[FaultReport], None],
) -> None:
    deployment = deployments()
    r = redis_for(deployment.redis_url)
    victim, survivor = processes.worker(deployment, "a"), processes.worker(deployment, "b")
    await asyncio.gather(
        victim.wait_registered(r, deployment.names), survivor.wait_registered(r, deployment.names)
    )
    await wait_assignment([victim, survivor], deployment.partitions)
    victim_partitions = victim.assignment() or set()

    async with PlazaClient(deployment.settings()) as client:
        stream = client.results_stream("fault-worker-kill")
        tail = ResultTail(deployment.redis_url, stream).start()
        load = Load(client, stream, REQUESTS, rate=1e6, chunk=REQUESTS)  # one publish_many
        publishing = asyncio.create_task(load.run())
        try:
            # Kill the victim as soon as it is busy: most of the requests are still open.
            await wait_for(
                lambda: tail.by_worker[victim.worker_id] >= 20,
                60,
                "the victim's first answers",
                victim.tail,
            )
            victim.kill9()
            fault_at = time.monotonic()
            await publishing
            await wait_all_answered(tail, REQUESTS, deployment, survivor.tail, 90)
        finally:
            publishing.cancel()
            await tail.stop()
        survivor.check_alive()

    report = await audit(
        "worker_kill",
        r,
        deployment.names,
        load.expected,
        stream,
        tail.worst_wait_s(load),
        open_at_kill=tail.open_at(load, fault_at),
        taken_over=taken_over(
            load.sent_at, tail.first_seen, victim_partitions, deployment.partitions, fault_at
        ),
        by_victim=tail.by_worker[victim.worker_id],
        by_survivor=tail.by_worker[survivor.worker_id],
        resent=load.resent,
    )
    record_fault(report)
    assert report.details["open_at_kill"] >= REQUESTS // 3, "the kill missed the load"
    assert report.details["taken_over"] > 0, "the victim left nothing for the survivor"
    report.check()
