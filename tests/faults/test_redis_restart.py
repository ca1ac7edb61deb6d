"""Fault 3: kill -9 Redis (AOF, appendfsync always) under load and start it again.

The test runs its own Redis, so the session's server is untouched. While Redis is down the
worker keeps fetching and computing, and its writer retries each batch's write until Redis
is back (``ResultWriter.write_until_done``); offsets are committed only after a write
succeeded. With ``appendfsync always`` a write Redis acknowledged survives the SIGKILL, so
no answer can be lost between a Redis write and an offset commit: every request answered,
exactly once, correctly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np
import pytest
import redis.asyncio

from plaza.client import PlazaClient
from plaza.stack.local_services import RedisServer
from tests.faults.audit import FaultReport, audit, wait_all_answered
from tests.faults.harness import Deployment, wait_for
from tests.faults.processes import Processes
from tests.faults.traffic import Load, ResultTail

REQUESTS = 2000


@pytest.mark.timeout(150)
async def test_redis_killed_and_restarted_under_load(
    redis_server_factory: Callable[..., RedisServer],
    deployments: Callable[..., Deployment],
    processes: Processes,
    redis_for: Callable[[str], redis.asyncio.Redis],
    record_fault: Callable[[FaultReport], None],
) -> None:
    server = redis_server_factory(appendfsync="always")
    deployment = deployments(redis_url=server.url)
    r = redis_for(server.url)
    worker = processes.worker(deployment, "w")
    await worker.wait_registered(r, deployment.names)

    async with PlazaClient(deployment.settings()) as client:
        stream = client.results_stream("fault-redis-restart")
        tail = ResultTail(server.url, stream).start()
        load = Load(client, stream, REQUESTS, rate=800, chunk=50)
        publishing = asyncio.create_task(load.run())
        try:
            await wait_for(
                lambda: tail.answered >= REQUESTS // 4, 60, "answers before the fault", worker.tail
            )
            server.kill()
            fault_at = time.monotonic()
            # Keep Redis away while requests go on arriving: the worker must hold them.
            acked_at_kill = load.acked
            await wait_for(
                lambda: load.acked >= min(REQUESTS, acked_at_kill + 800),
                60,
                "requests published while Redis is down",
            )
            down_s = time.monotonic() - fault_at
            server.start()
            await server.wait_ready_async()
            await publishing
            await wait_all_answered(tail, REQUESTS, deployment, worker.tail)
        finally:
            publishing.cancel()
            await tail.stop()
        worker.check_alive()

    fresh = redis_for(server.url)  # r's pooled connections died with the old server
    report = await audit(
        "redis_restart",
        fresh,
        deployment.names,
        load.expected,
        stream,
        tail.worst_wait_s(load),
        open_at_kill=tail.open_at(load, fault_at),
        redis_down_s=f"{down_s:.1f}",
        worker_log_warnings=worker.log_problems(),
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
