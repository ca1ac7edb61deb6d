"""Faults of an ensemble: kill -9 its runner, or a step model's worker, mid-load.

The runner: kill -9 it in the middle of a load, then start another.

What it shows: the ensemble requests the dead runner had taken in but not answered stay
uncommitted in the ensemble's topic; the next runner of its consumer group replays them
with the same step ids, uses the step answers already stored, waits for the rest, and
answers every request exactly once and correctly: the result keys hold one answer per
correlation id and the result stream no second entry for any (first write wins).

A step worker: one of the step model's two workers dies; its group replays the step
requests it held to the other, and the runner, still waiting, gets their answers.

The ensemble is ``chain``: identity -> identity, on the simulated identity at 2 ms a row,
so the load lasts seconds and the kill lands in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import redis.asyncio
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition

from plaza.client import PlazaClient, make_request
from plaza.contract import InferRequest
from plaza.stack import ChildProcess, Deployment, wait_assignment, wait_for
from plaza.statistics import ModelStatistics
from tests.faults.audit import FaultReport, audit
from tests.faults.harness import value
from tests.faults.processes import WORKER_ENV, FaultProcesses
from tests.faults.test_worker_kill import slow_identity_repository
from tests.faults.traffic import Load, ResultTail
from tests.integration.test_ensemble import CHAIN  # the same two-step chain
from tests.support import short_session

ENSEMBLE = "chain"
REQUESTS = 600


class EnsembleLoad(Load):
    """The fault suite's load, addressed to the ensemble (same inputs, same answers)."""

    def request(self, i: int) -> InferRequest:
        return make_request(
            ENSEMBLE, {"INPUT0": value(i)}, reply_stream=self.stream, correlation_id=f"ens-{i:06d}"
        )


def runner_process(deployment: Deployment, log_dir: Path, name: str) -> ChildProcess:
    """``python -m plaza.workers.ensemble`` for the ensemble, with worker id ``name``."""
    env = deployment.env(**WORKER_ENV, PLAZA_WORKER__MODEL=ENSEMBLE, PLAZA_WORKER__WORKER_ID=name)
    argv = [sys.executable, "-m", "plaza.workers.ensemble"]
    return ChildProcess(name, argv, log_dir / f"{name}.log", env=env)


async def wait_registered(deployment: Deployment, proc: ChildProcess) -> None:
    """Until the runner heartbeats in the ensemble's registry; fails at once if it exits."""
    key = deployment.names.worker_registry_key(ENSEMBLE)
    client = redis.asyncio.Redis.from_url(deployment.redis_url)

    async def registered() -> bool:
        proc.check()
        score = await client.zscore(key, proc.name)
        return score is not None and score > time.time()

    try:
        await wait_for(registered, 120, f"{proc.name} in {key}", proc.tail)
    finally:
        await client.aclose()


async def uncommitted(deployment: Deployment) -> int:
    """Records of the ensemble's topic its runners' group has not committed yet."""
    topic = deployment.names.request_topic(ENSEMBLE)
    group = deployment.names.consumer_group(ENSEMBLE)
    tps = [TopicPartition(topic, p) for p in range(deployment.partitions)]
    admin = AIOKafkaAdminClient(bootstrap_servers=deployment.bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=deployment.bootstrap, group_id=None)
    try:
        await admin.start()
        await consumer.start()
        committed = await admin.list_consumer_group_offsets(group, partitions=tps)
        ends = await consumer.end_offsets(tps)
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()
        with contextlib.suppress(Exception):
            await admin.close()
    return sum(
        max(0, ends[tp] - max(0, committed[tp].offset if tp in committed else 0)) for tp in tps
    )


async def step_rows(deployment: Deployment) -> int:
    """Rows the identity workers ran as far as their statistics were flushed (both steps of
    every request, plus any rerun; a killed worker's last unflushed rows are missing)."""
    client = redis.asyncio.Redis.from_url(deployment.redis_url)
    try:
        raw = await client.hgetall(deployment.names.model_stats_key("identity", "1"))
    finally:
        await client.aclose()
    return ModelStatistics.from_fields(raw).inference_count


def ensemble_repository(root: Path) -> Path:
    """The slow identity and ``chain`` over it (an ensemble's version folder is empty)."""
    repository = slow_identity_repository(root)
    (repository / ENSEMBLE / "1").mkdir(parents=True)
    (repository / ENSEMBLE / "config.pbtxt").write_text(CHAIN)
    return repository


Strike = Callable[[], Awaitable[list[ChildProcess]]]
"""Injects the fault once the first answers came; returns the processes started since."""


async def run_under_fault(
    deployment: Deployment, name: str, strike: Strike, watch: list[ChildProcess]
) -> tuple[FaultReport, ResultTail]:
    """Publish the load at once, ``strike`` once 20 are answered, wait for every answer and
    the ensemble group's commits; the audit's report (and the tail, to count who answered)."""
    async with PlazaClient(deployment.settings()) as client:
        stream = client.results_stream(f"fault-{name}")
        load = EnsembleLoad(client, stream, REQUESTS, rate=1e6, chunk=REQUESTS)
        tail = ResultTail(deployment.redis_url, stream).start()
        try:
            await load.run()  # one publish_many: every request is in flight at the fault
            await wait_for(lambda: tail.answered >= 20, 60, "the first answers", watch[0].tail)
            open_at_fault = REQUESTS - tail.answered
            watch = [*watch, *await strike()]
            await wait_for(
                lambda: tail.answered >= REQUESTS,
                120,
                "every answer",
                lambda: f"{tail.answered}/{REQUESTS}\n" + "\n".join(p.tail() for p in watch),
            )
            await wait_for(lambda: _drained(deployment), 60, "the ensemble group's commits")
        finally:
            await tail.stop()
    for proc in watch:
        proc.check()  # killed by the fault is fine; crashed is not
    r = redis.asyncio.Redis.from_url(deployment.redis_url)
    try:
        report = await audit(
            name,
            r,
            deployment.names,
            load.expected,
            stream,
            tail.worst_wait_s(load),
            open_at_fault=open_at_fault,
            step_rows_flushed=await step_rows(deployment),
        )
    finally:
        await r.aclose()
    return report, tail


@pytest.mark.timeout(180)
async def test_ensemble_runner_killed_mid_load(
    deployments: Callable[..., Deployment],
    processes: FaultProcesses,
    record_fault: Callable[[FaultReport], None],
    tmp_path: Path,
) -> None:
    repository = ensemble_repository(tmp_path / "repository")
    deployment = short_session(deployments(repository=repository))
    worker = processes.worker(deployment, "identity")
    victim = processes.start(
        runner_process(deployment, processes.log_dir, f"{deployment.prefix}-a")
    )
    await asyncio.gather(worker.wait_registered(), wait_registered(deployment, victim))
    survivor_name = f"{deployment.prefix}-b"

    async def kill_runner() -> list[ChildProcess]:
        victim.kill()
        return [processes.start(runner_process(deployment, processes.log_dir, survivor_name))]

    report, tail = await run_under_fault(deployment, "ensemble_runner_kill", kill_runner, [worker])
    report.details.update(
        by_victim=tail.by_worker[victim.name], by_survivor=tail.by_worker[survivor_name]
    )
    record_fault(report)
    assert report.details["open_at_fault"] >= REQUESTS // 3, "the kill missed the load"
    assert report.details["by_survivor"] > 0, "the dead runner left nothing to replay"
    report.check()


@pytest.mark.timeout(180)
async def test_ensemble_step_worker_killed_mid_load(
    deployments: Callable[..., Deployment],
    processes: FaultProcesses,
    record_fault: Callable[[FaultReport], None],
    tmp_path: Path,
) -> None:
    """The other half: a step model's worker dies; its group replays the step requests to
    the surviving worker, whose answers reach the (living) runner: nothing is lost."""
    repository = ensemble_repository(tmp_path / "repository")
    deployment = short_session(deployments(repository=repository))
    victim, survivor = processes.worker(deployment, "a"), processes.worker(deployment, "b")
    runner = processes.start(
        runner_process(deployment, processes.log_dir, f"{deployment.prefix}-r")
    )
    await asyncio.gather(
        victim.wait_registered(), survivor.wait_registered(), wait_registered(deployment, runner)
    )
    await wait_assignment([victim, survivor], deployment.partitions)

    async def kill_worker() -> list[ChildProcess]:
        victim.kill()
        return []

    report, _ = await run_under_fault(
        deployment, "ensemble_step_worker_kill", kill_worker, [runner, survivor]
    )
    record_fault(report)
    assert report.details["open_at_fault"] >= REQUESTS // 3, "the kill missed the load"
    report.check()


async def _drained(deployment: Deployment) -> bool:
    try:
        return await uncommitted(deployment) == 0
    except Exception:  # the group coordinator busy with the rebalance: ask again
        return False
