"""The one script of the load tests: load -> fault -> every answer -> audit.

A test says only which fault it injects and what it expects of the report::

    report = await run_fault_under_load(
        deployment, [worker], name="kafka_restart", fault=restart, requests=3000, rate=1000
    )
    record_fault(report)
    report.check()

The helper publishes a paced identity load (:class:`~tests.faults.traffic.Load`) with
answers to a result stream it follows (:class:`~tests.faults.traffic.ResultTail`), strikes
once the load is under way (``strike_when``; default: a quarter answered), waits until
every request was answered and the worker group committed them all, checks that no
worker crashed, and audits the answers per correlation id.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio

from plaza.client import PlazaClient
from plaza.stack import Deployment, WorkerProcess, wait_for
from tests.faults.audit import FaultReport, audit, wait_all_answered
from tests.faults.processes import log_problems
from tests.faults.traffic import Load, ResultTail

STRIKE_LIMIT_S = 60.0
"""How long the load may take to get under way before the fault."""


@dataclass
class FaultRun:
    """One run in progress, as the fault and the expectations see it."""

    deployment: Deployment
    workers: Sequence[WorkerProcess]
    load: Load
    tail: ResultTail
    fault_at: float = field(default=float("nan"))
    """When the fault was injected (monotonic), set just before ``fault`` runs."""

    def worker_logs(self) -> str:
        return "\n".join(worker.tail(20) for worker in self.workers)


Fault = Callable[[FaultRun], Awaitable[dict[str, Any]]]
"""Injects the fault (and brings the broken part back, if the test wants it back); returns
details for the report (``{"redis_down_s": "3.1"}``)."""


def a_quarter_answered(run: FaultRun) -> bool:
    """The default moment to strike: a quarter of the requests answered."""
    return run.tail.answered >= run.load.n // 4


async def run_fault_under_load(
    deployment: Deployment,
    workers: Sequence[WorkerProcess],
    *,
    name: str,
    fault: Fault,
    requests: int,
    rate: float,
    chunk: int = 50,
    strike_when: Callable[[FaultRun], bool] = a_quarter_answered,
    extra_details: Callable[[FaultRun], dict[str, Any]] | None = None,
    answer_limit_s: float = 120.0,
) -> FaultReport:
    """Run ``fault`` under a load of ``requests`` identity requests; the audit's report.

    ``extra_details`` adds what only the finished run can count (who answered what).
    Raises if an answer or the final commit does not come in time, or a worker crashed.
    """
    details: dict[str, Any] = {}
    async with PlazaClient(deployment.settings()) as client:
        stream = client.results_stream(f"fault-{name}")
        load = Load(client, stream, requests, rate=rate, chunk=chunk)
        run = FaultRun(deployment, workers, load, ResultTail(deployment.redis_url, stream))
        await _load_with_fault(run, fault, strike_when, answer_limit_s, details)
    for worker in workers:
        worker.check()  # killed by the fault is fine; crashed is not
    details.update(extra_details(run) if extra_details else {})
    return await _audit(run, name, stream, details)


async def _load_with_fault(
    run: FaultRun,
    fault: Fault,
    strike_when: Callable[[FaultRun], bool],
    answer_limit_s: float,
    details: dict[str, Any],
) -> None:
    run.tail.start()
    publishing = asyncio.create_task(run.load.run())
    try:
        await wait_for(
            lambda: strike_when(run), STRIKE_LIMIT_S, "the load before the fault", run.worker_logs
        )
        run.fault_at = time.monotonic()
        details.update(await fault(run))
        await publishing
        await wait_all_answered(
            run.tail, run.load.n, run.deployment, run.worker_logs, answer_limit_s
        )
    finally:
        publishing.cancel()
        await run.tail.stop()


async def _audit(run: FaultRun, name: str, stream: str, details: dict[str, Any]) -> FaultReport:
    # A fresh client: Redis may have been restarted under the test's earlier ones.
    client = redis.asyncio.Redis.from_url(
        run.deployment.redis_url, socket_timeout=5, socket_connect_timeout=1
    )
    try:
        return await audit(
            name,
            client,
            run.deployment.names,
            run.load.expected,
            stream,
            run.tail.worst_wait_s(run.load),
            open_at_fault=run.tail.open_at(run.load, run.fault_at),
            resent=run.load.resent,
            publish_errors=sum(run.load.errors.values()),
            worker_log_warnings=sum(log_problems(worker) for worker in run.workers),
            **details,
        )
    finally:
        await client.aclose()
