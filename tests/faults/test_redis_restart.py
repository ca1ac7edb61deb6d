"""Fault 3: kill -9 Redis (AOF, appendfsync always) under load and start it again.

The test runs its own Redis, so the session's server is untouched. While Redis is down the
worker keeps fetching and computing, and its writer retries each batch's write until Redis
is back (``ResultWriter.write_until_done``); offsets are committed only after a write
succeeded. With ``appendfsync always`` a write Redis acknowledged survives the SIGKILL, so
no answer can be lost between a Redis write and an offset commit: every request answered,
exactly once, correctly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from plaza.client import PlazaClient
from plaza.stack import Deployment, RedisServer, wait_for
from tests.faults.audit import FaultReport
from tests.faults.processes import FaultProcesses
from tests.faults.under_load import FaultRun, run_fault_under_load

REQUESTS = 2000
PUBLISHED_WHILE_DOWN = 800


@pytest.mark.timeout(150)
async def test_redis_killed_and_restarted_under_load(
    redis_server_factory: Callable[..., RedisServer],
    deployments: Callable[..., Deployment],
    processes: FaultProcesses,
    record_fault: Callable[[FaultReport], None],
) -> None:
    server = redis_server_factory(appendfsync="always")
    deployment = deployments(redis_url=server.url)
    worker = processes.worker(deployment, "w")
    await worker.wait_registered()

    async def kill_redis_for_a_while(run: FaultRun) -> dict[str, Any]:
        server.kill()
        # Keep Redis away while requests go on arriving: the worker must hold them.
        acked_at_kill = run.load.acked
        await wait_for(
            lambda: run.load.acked >= min(REQUESTS, acked_at_kill + PUBLISHED_WHILE_DOWN),
            60,
            "requests published while Redis is down",
        )
        down_s = time.monotonic() - run.fault_at
        server.start()
        await server.wait_ready_async()
        return {"redis_down_s": f"{down_s:.1f}"}

    report = await run_fault_under_load(
        deployment,
        [worker],
        name="redis_restart",
        fault=kill_redis_for_a_while,
        requests=REQUESTS,
        rate=800,
    )
    record_fault(report)
    report.check()


@pytest.mark.timeout(60)
async def test_polling_a_job_right_after_a_redis_restart(
    redis_server_factory: Callable[..., RedisServer],
    deployments: Callable[..., Deployment],
) -> None:
    """The first command on a pooled connection that Redis closed must not fail the caller.

    Plaza's Redis clients (plaza/connections.py ``redis_client``) are built without a retry
    policy, and redis-py 8 then does not retry: after any Redis restart, the next
    ``PlazaClient.poll`` / ``result`` raises ConnectionError (and the gateway's
    ``GET /v2/jobs/{id}`` answers 503) once per pooled connection, though Redis is back.
    """
    server = redis_server_factory(appendfsync="always")
    deployment = deployments(redis_url=server.url)
    async with PlazaClient(deployment.settings()) as client:
        job = await client.submit("identity", {"INPUT0": np.zeros((1, 2), np.float32)})
        assert (await client.poll(job)).state == "pending"
        server.restart()
        await server.wait_ready_async()
        assert (await client.poll(job)).state == "pending"
