"""Fault 2: restart the (only) Kafka broker while requests flow.

The test runs its own one-node cluster, so the session's broker is untouched. The broker
is stopped (SIGTERM, a controlled shutdown; in the ``kill9`` case SIGKILL) and started
again on the same data while the load keeps publishing: the producer's sends wait (or
fail and are sent again), the worker's fetches and commits fail until the broker is back,
then it rejoins its group and carries on from the last committed offsets. What it shows:
every request answered, exactly once, correctly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
import redis.asyncio

from plaza.client import PlazaClient
from plaza.stack.local_services import KafkaCluster
from tests.faults.audit import FaultReport, audit, wait_all_answered
from tests.faults.harness import Deployment, wait_for
from tests.faults.processes import Processes
from tests.faults.traffic import Load, ResultTail

REQUESTS = 3000


@pytest.mark.timeout(180)
@pytest.mark.parametrize("hard", [False, True], ids=["graceful", "kill9"])
async def test_kafka_broker_restarted_under_load(
    hard: bool,
    kafka_cluster_factory: Callable[..., KafkaCluster],
    deployments: Callable[..., Deployment],
    processes: Processes,
    redis_for: Callable[[str], redis.asyncio.Redis],
    record_fault: Callable[[FaultReport], None],
) -> None:
    cluster = kafka_cluster_factory(nodes=1)
    deployment = deployments(bootstrap=cluster.bootstrap_servers)
    r = redis_for(deployment.redis_url)
    worker = processes.worker(deployment, "w")
    await worker.wait_registered(r, deployment.names)

    async with PlazaClient(deployment.settings()) as client:
        stream = client.results_stream("fault-kafka-restart")
        tail = ResultTail(deployment.redis_url, stream).start()
        load = Load(client, stream, REQUESTS, rate=1000, chunk=50)
        publishing = asyncio.create_task(load.run())
        try:
            await wait_for(
                lambda: tail.answered >= REQUESTS // 4, 60, "answers before the fault", worker.tail
            )
            fault_at = time.monotonic()
            # restart(0, hard=...), split: a graceful stop waits for the controlled shutdown
            # (so off the event loop); the start runs on this thread, as a node dies with the
            # thread that started it.
            if hard:
                cluster.kill(0)
            else:
                await asyncio.to_thread(cluster.stop_node, 0)
            down_s = time.monotonic() - fault_at
            cluster.start_node(0)
            await cluster.wait_ready_async(120)
            back_s = time.monotonic() - fault_at
            await publishing
            await wait_all_answered(tail, REQUESTS, deployment, worker.tail)
        finally:
            publishing.cancel()
            await tail.stop()
        worker.check_alive()

    report = await audit(
        "kafka_restart_kill9" if hard else "kafka_restart",
        r,
        deployment.names,
        load.expected,
        stream,
        tail.worst_wait_s(load),
        open_at_restart=tail.open_at(load, fault_at),
        stop_s=f"{down_s:.1f}",
        broker_back_s=f"{back_s:.1f}",
        resent=load.resent,
        publish_errors=sum(load.errors.values()),
        worker_log_warnings=worker.log_problems(),
    )
    record_fault(report)
    report.check()
