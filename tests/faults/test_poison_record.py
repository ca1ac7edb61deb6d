"""Fault: a record that kills every worker that takes it (a poison record).

The model is the simulated device with its fault-injection parameter ``abort_on_value``:
the worker process exits at once (``os._exit``, no answer, no commit) when a batch holds that
value. Without delivery counting, the record is replayed to each next owner of its
partition, which dies too, and the partition is blocked for good.

What it shows: the workers count each record's deliveries in Redis; a record seen before
runs alone, so its innocent batch-mates are answered in batches of their own; past
``worker.max_deliveries`` the record goes to the dead-letter topic and its caller gets a
``poison_record`` error answer. Every other request is answered correctly, and the group
(with its dead workers restarted, as a supervisor would) keeps serving.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis.asyncio
from aiokafka import AIOKafkaConsumer

from plaza.client import PlazaClient, make_request
from plaza.codec import decode_request
from plaza.naming import HEADER_ERROR_CODE
from plaza.stack import Deployment, WorkerProcess, wait_for
from plaza.workers.backends.simulated import ABORT_EXIT_CODE
from tests.faults.audit import read_result_keys
from tests.faults.processes import WORKER_ENV, FaultProcesses

MODEL = "poison"
POISON = -666.0
MAX_DELIVERIES = 2
SESSION_TIMEOUT_MS = 5000
"""Each death holds the dead worker's partitions until its session times out (the group
cannot tell a dead member from a slow one sooner): half the default 10 s, still far
longer than a live worker's pause between heartbeats (one a second)."""
CONFIG = f"""
name: "{MODEL}"
backend: "plaza_simulated"
max_batch_size: 16
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 20000 }}
parameters [
  {{ key: "latency_b_us" value: {{ string_value: "2000" }} }},
  {{ key: "abort_on_value" value: {{ string_value: "{POISON}" }} }}
]
"""


def poison_repository(root: Path) -> Path:
    (root / MODEL / "1").mkdir(parents=True)
    (root / MODEL / "config.pbtxt").write_text(CONFIG)
    return root


class Supervisor:
    """The test's workers, each restarted when it dies (as Kubernetes would)."""

    def __init__(self, processes: FaultProcesses, deployment: Deployment, size: int) -> None:
        self.processes = processes
        self.deployment = deployment
        self.workers: list[WorkerProcess] = []
        self.deaths: list[int | None] = []
        for _ in range(size):
            self.workers.append(self._start())

    def _start(self) -> WorkerProcess:
        name = f"w{len(self.workers) + len(self.deaths)}"
        env = {
            **WORKER_ENV,
            "PLAZA_WORKER__MAX_DELIVERIES": str(MAX_DELIVERIES),
            "PLAZA_KAFKA__SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
        }
        worker = WorkerProcess(
            self.deployment,
            MODEL,
            self.processes.log_dir,
            name=name,
            worker_id=f"{self.deployment.prefix}-{name}",
            env=env,
        )
        return self.processes.start(worker)

    def restart_dead(self) -> None:
        for i, worker in enumerate(self.workers):
            if not worker.alive:
                self.deaths.append(worker.exit_code)
                self.workers[i] = self._start()

    def logs(self) -> str:
        return "\n".join(w.tail(15) for w in self.workers)


def request(i: int, stream: str, value: float | None = None) -> Any:
    x = np.full((1, 3), float(i) if value is None else value, dtype=np.float32)
    return make_request(MODEL, {"INPUT0": x}, reply_stream=stream, correlation_id=f"req-{i:05d}")


async def answers(
    client: redis.asyncio.Redis, deployment: Deployment, ids: list[str]
) -> dict[str, Any]:
    return await read_result_keys(client, deployment.names, ids)


async def dead_letters(deployment: Deployment) -> list[tuple[str, dict[str, bytes]]]:
    """(correlation id, headers) of every record in the model's dead-letter topic."""
    topic = deployment.names.dead_letter_topic(MODEL)
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=deployment.bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        got = await consumer.getmany(timeout_ms=5000)
    finally:
        await consumer.stop()
    return [
        (decode_request(r.value).id, dict(r.headers))
        for records in got.values()
        for r in records
        if r.value is not None
    ]


@pytest.mark.timeout(240)
async def test_poison_record_is_dead_lettered_and_the_group_keeps_serving(
    deployments: Callable[..., Deployment],
    processes: FaultProcesses,
    redis_for: Callable[[str], redis.asyncio.Redis],
    tmp_path: Path,
) -> None:
    base = deployments()  # its keys are deleted afterwards
    deployment = dataclasses.replace(base, repository=poison_repository(tmp_path / "repo"))
    group = Supervisor(processes, deployment, size=2)
    for worker in group.workers:
        await worker.wait_registered()
    r = redis_for(deployment.redis_url)
    async with PlazaClient(deployment.settings()) as client:
        stream = client.results_stream("poison")
        first = [request(i, stream) for i in range(200)]
        first[100] = request(100, stream, POISON)
        poison_id = first[100].id
        await client.publish_many(first)
        ids = [req.id for req in first]

        async def all_answered() -> bool:
            group.restart_dead()
            return len(await answers(r, deployment, ids)) == len(ids)

        await wait_for(all_answered, 180, "every request answered", group.logs)
        got = await answers(r, deployment, ids)
        # The group keeps serving after the poison record is gone.
        later = [request(i, stream) for i in range(200, 260)]
        await client.publish_many(later)
        later_ids = [req.id for req in later]

        async def later_answered() -> bool:
            group.restart_dead()
            return len(await answers(r, deployment, later_ids)) == len(later_ids)

        await wait_for(later_answered, 60, "requests after the poison record", group.logs)
        got.update(await answers(r, deployment, later_ids))

    poison = got.pop(poison_id)
    assert poison.error is not None and poison.error.code == "poison_record", poison
    assert all(res.error is None for res in got.values()), "an innocent request failed"
    for rid, res in got.items():
        expected = np.full((1, 3), float(rid.removeprefix("req-")), dtype=np.float32)
        np.testing.assert_array_equal(res.output("OUTPUT0").to_numpy(), expected)
    assert ABORT_EXIT_CODE in group.deaths, "the poison record never killed a worker"
    assert len(group.deaths) <= MAX_DELIVERIES, f"more deaths than deliveries: {group.deaths}"
    letters = await dead_letters(deployment)
    assert [rid for rid, _ in letters] == [poison_id]
    assert letters[0][1][HEADER_ERROR_CODE] == b"poison_record"
