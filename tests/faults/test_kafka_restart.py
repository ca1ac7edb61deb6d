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
from typing import Any

import pytest

from plaza.stack import Deployment, KafkaCluster
from tests.faults.audit import FaultReport
from tests.faults.processes import FaultProcesses
from tests.faults.under_load import FaultRun, run_fault_under_load

REQUESTS = 3000


@pytest.mark.timeout(180)
@pytest.mark.parametrize("hard", [False, True], ids=["graceful", "kill9"])
async def test_kafka_broker_restarted_under_load(
    hard: bool,
    kafka_cluster_factory: Callable[..., KafkaCluster],
    deployments: Callable[..., Deployment],
    processes: FaultProcesses,
    record_fault: Callable[[FaultReport], None],
) -> None:
    cluster = kafka_cluster_factory(nodes=1)
    deployment = deployments(bootstrap=cluster.bootstrap_servers)
    worker = processes.worker(deployment, "w")
    await worker.wait_registered()

    async def restart_broker(run: FaultRun) -> dict[str, Any]:
        # restart(0, hard=...), split: a graceful stop waits for the controlled shutdown
        # (so off the event loop); the start runs on this thread, as a node dies with the
        # thread that started it.
        if hard:
            cluster.kill(0)
        else:
            await asyncio.to_thread(cluster.stop_node, 0)
        down_s = time.monotonic() - run.fault_at
        cluster.start_node(0)
        await cluster.wait_ready_async(120)
        back_s = time.monotonic() - run.fault_at
        return {"stop_s": f"{down_s:.1f}", "broker_back_s": f"{back_s:.1f}"}

    report = await run_fault_under_load(
        deployment,
        [worker],
        name="kafka_restart_kill9" if hard else "kafka_restart",
        fault=restart_broker,
        requests=REQUESTS,
        rate=1000,
    )
    record_fault(report)
    report.check()
