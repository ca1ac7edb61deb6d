"""Fault 4: kill -9 one broker of a three-broker KRaft cluster under load.

Topics are replicated three ways with min.insync.replicas 2 (the workers and the SDK create
them so: PLAZA_KAFKA__REPLICATION_FACTOR=3, PLAZA_KAFKA__MIN_INSYNC_REPLICAS=2). The broker
killed is the worker group's coordinator, so both the group and the partitions it leads
move. With two brokers left every write still reaches two in-sync replicas: the service
continues, and every request is answered exactly once, correctly.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import pytest
import redis.asyncio
from aiokafka.admin import AIOKafkaAdminClient

from plaza.client import PlazaClient
from plaza.stack.local_services import KafkaCluster
from tests.faults.audit import FaultReport, audit, wait_all_answered
from tests.faults.harness import Deployment, wait_for
from tests.faults.processes import Processes
from tests.faults.traffic import Load, ResultTail

REQUESTS = 2000


async def coordinator(deployment: Deployment) -> int:
    """The broker that coordinates the worker group."""
    admin = AIOKafkaAdminClient(bootstrap_servers=deployment.bootstrap, request_timeout_ms=5000)
    try:
        await admin.start()
        return int(await admin.find_coordinator(deployment.group))
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


async def replicas(deployment: Deployment) -> list[int]:
    """The replica count of each partition of the request topic."""
    admin = AIOKafkaAdminClient(bootstrap_servers=deployment.bootstrap, request_timeout_ms=5000)
    try:
        await admin.start()
        (topic,) = await admin.describe_topics([deployment.topic])
        return [len(p["replicas"]) for p in topic["partitions"]]
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


@pytest.mark.timeout(180)
async def test_one_of_three_brokers_killed_under_load(
    kafka_cluster_factory: Callable[..., KafkaCluster],
    deployments: Callable[..., Deployment],
    processes: Processes,
    redis_for: Callable[[str], redis.asyncio.Redis],
    record_fault: Callable[[FaultReport], None],
) -> None:
    cluster = kafka_cluster_factory(nodes=3, min_insync_replicas=2)
    deployment = deployments(
        bootstrap=cluster.bootstrap_servers, replication_factor=3, min_insync_replicas=2
    )
    r = redis_for(deployment.redis_url)
    worker = processes.worker(deployment, "w")
    await worker.wait_registered(r, deployment.names)
    assert await replicas(deployment) == [3] * deployment.partitions

    async with PlazaClient(deployment.settings()) as client:
        stream = client.results_stream("fault-broker-kill")
        tail = ResultTail(deployment.redis_url, stream).start()
        load = Load(client, stream, REQUESTS, rate=600, chunk=50)
        publishing = asyncio.create_task(load.run())
        try:
            await wait_for(
                lambda: tail.answered >= REQUESTS // 4, 60, "answers before the fault", worker.tail
            )
            victim = await coordinator(deployment)
            cluster.kill(victim)
            fault_at = time.monotonic()
            await publishing
            await wait_all_answered(tail, REQUESTS, deployment, worker.tail)
        finally:
            publishing.cancel()
            await tail.stop()
        worker.check_alive()
    assert cluster.running_nodes() == sorted(set(cluster.node_ids) - {victim})

    report = await audit(
        "broker_kill_3node",
        r,
        deployment.names,
        load.expected,
        stream,
        tail.worst_wait_s(load),
        killed_node=victim,
        open_at_kill=tail.open_at(load, fault_at),
        resent=load.resent,
        publish_errors=sum(load.errors.values()),
        worker_log_warnings=worker.log_problems(),
    )
    record_fault(report)
    report.check()
