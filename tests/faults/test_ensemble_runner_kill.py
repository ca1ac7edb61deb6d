"""Fault: kill -9 the ensemble runner in the middle of a load, then start another.

What it shows: the ensemble requests the dead runner had taken in but not answered stay
uncommitted in the ensemble's topic; the next runner of its consumer group replays them
with the same step ids, uses the step answers already stored, waits for the rest, and
answers every request exactly once and correctly: the result keys hold one answer per
correlation id and the result stream no second entry for any (first write wins).

The ensemble is ``chain``: identity -> identity, on the simulated identity at 2 ms a row,
so the load lasts seconds and the kill lands in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis.asyncio
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition

from plaza.client import PlazaClient, make_request
from plaza.contract import InferRequest
from plaza.stack import ChildProcess, Deployment, wait_for
from plaza.statistics import ModelStatistics
from tests.faults.audit import FaultReport, audit
from tests.faults.harness import value
from tests.faults.processes import WORKER_ENV, FaultProcesses
from tests.faults.test_worker_kill import slow_identity_repository
from tests.faults.traffic import Load, ResultTail

ENSEMBLE = "chain"
REQUESTS = 600
CHAIN = """
name: "chain"
platform: "ensemble"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "identity"
      model_version: -1
      input_map { key: "INPUT0" value: "INPUT0" }
      output_map { key: "OUTPUT0" value: "middle" }
    },
    {
      model_name: "identity"
      model_version: -1
      input_map { key: "INPUT0" value: "middle" }
      output_map { key: "OUTPUT0" value: "OUTPUT0" }
    }
  ]
}
"""


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
    """Rows the identity worker ran (both steps of every request, plus any rerun)."""
    client = redis.asyncio.Redis.from_url(deployment.redis_url)
    try:
        raw = await client.hgetall(deployment.names.model_stats_key("identity", "1"))
    finally:
        await client.aclose()
    return ModelStatistics.from_fields(raw).inference_count


@pytest.mark.timeout(180)
async def test_ensemble_runner_killed_mid_load(
    deployments: Callable[..., Deployment],
    processes: FaultProcesses,
    record_fault: Callable[[FaultReport], None],
    tmp_path: Path,
) -> None:
    repository = slow_identity_repository(tmp_path / "repository")
    (repository / ENSEMBLE / "1").mkdir(parents=True)  # an ensemble's version folder is empty
    (repository / ENSEMBLE / "config.pbtxt").write_text(CHAIN)
    deployment = deployments(repository=repository)
    worker = processes.worker(deployment, "identity")
    victim = processes.start(
        runner_process(deployment, processes.log_dir, f"{deployment.prefix}-a")
    )
    await asyncio.gather(worker.wait_registered(), wait_registered(deployment, victim))

    async with PlazaClient(deployment.settings()) as client:
        stream = client.results_stream("fault-ensemble")
        load = EnsembleLoad(client, stream, REQUESTS, rate=1e6, chunk=REQUESTS)
        tail = ResultTail(deployment.redis_url, stream).start()
        try:
            await load.run()  # one publish_many: every request is in flight at the kill
            await wait_for(lambda: tail.answered >= 20, 60, "the first answers", victim.tail)
            victim.kill()
            open_at_fault = REQUESTS - tail.answered
            survivor = processes.start(
                runner_process(deployment, processes.log_dir, f"{deployment.prefix}-b")
            )
            await wait_for(
                lambda: tail.answered >= REQUESTS,
                120,
                "every answer",
                lambda: f"{tail.answered}/{REQUESTS}\n{survivor.tail()}\n{worker.tail()}",
            )
            await wait_for(lambda: _drained(deployment), 60, "the ensemble group's commits")
        finally:
            await tail.stop()
    survivor.check()
    worker.check()
    by_survivor = tail.by_worker[survivor.name]
    r = redis.asyncio.Redis.from_url(deployment.redis_url)
    try:
        report = await audit(
            "ensemble_runner_kill",
            r,
            deployment.names,
            load.expected,
            stream,
            tail.worst_wait_s(load),
            open_at_fault=open_at_fault,
            by_victim=tail.by_worker[victim.name],
            by_survivor=by_survivor,
            step_rows=await step_rows(deployment),
        )
    finally:
        await r.aclose()
    record_fault(report)
    assert open_at_fault >= REQUESTS // 3, "the kill missed the load"
    assert by_survivor > 0, "the dead runner left nothing to replay"
    report.check()


async def _drained(deployment: Deployment) -> bool:
    try:
        return await uncommitted(deployment) == 0
    except Exception:  # the group coordinator busy with the rebalance: ask again
        return False
