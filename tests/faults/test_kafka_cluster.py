"""Fault 4: kill -9 one broker of a three-broker KRaft cluster under load.

Topics are replicated three ways with min.insync.replicas 2 (the workers and the SDK create
them so: PLAZA_KAFKA__REPLICATION_FACTOR=3, PLAZA_KAFKA__MIN_INSYNC_REPLICAS=2). The broker
killed is the worker group's coordinator, so both the group and the partitions it leads
move. With two brokers left every write still reaches two in-sync replicas: the service
continues, and every request is answered exactly once, correctly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from plaza.stack import Deployment, KafkaCluster
from tests.faults.audit import FaultReport
from tests.faults.harness import request_topic, worker_group
from tests.faults.processes import FaultProcesses
from tests.faults.under_load import FaultRun, run_fault_under_load

REQUESTS = 2000


async def coordinator(deployment: Deployment) -> int:
    """The broker that coordinates the worker group."""
    admin = AIOKafkaAdminClient(bootstrap_servers=deployment.bootstrap, request_timeout_ms=5000)
    try:
        await admin.start()
        return int(await admin.find_coordinator(worker_group(deployment)))
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


async def replicas(deployment: Deployment) -> list[int]:
    """The replica count of each partition of the request topic."""
    admin = AIOKafkaAdminClient(bootstrap_servers=deployment.bootstrap, request_timeout_ms=5000)
    try:
        await admin.start()
        (topic,) = await admin.describe_topics([request_topic(deployment)])
        return [len(p["replicas"]) for p in topic["partitions"]]
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


@pytest.mark.timeout(180)
async def test_one_of_three_brokers_killed_under_load(
    kafka_cluster_factory: Callable[..., KafkaCluster],
    deployments: Callable[..., Deployment],
    processes: FaultProcesses,
    record_fault: Callable[[FaultReport], None],
) -> None:
    cluster = kafka_cluster_factory(nodes=3, min_insync_replicas=2)
    deployment = deployments(
        bootstrap=cluster.bootstrap_servers, replication_factor=3, min_insync_replicas=2
    )
    worker = processes.worker(deployment, "w")
    await worker.wait_registered()
    assert await replicas(deployment) == [3] * deployment.partitions
    killed: list[int] = []

    async def kill_coordinator(run: FaultRun) -> dict[str, Any]:
        killed.append(await coordinator(deployment))
        cluster.kill(killed[0])
        return {"killed_node": killed[0]}

    report = await run_fault_under_load(
        deployment,
        [worker],
        name="broker_kill_3node",
        fault=kill_coordinator,
        requests=REQUESTS,
        rate=600,
    )
    assert cluster.running_nodes() == sorted(set(cluster.node_ids) - set(killed))
    record_fault(report)
    report.check()
