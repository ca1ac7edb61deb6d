"""Fault: kill -9 the worker of running sequences, with a request of each in flight.

A stateful model's sequences (the sample ``accumulate``: a running sum as the model's
implicit state) run on one worker. It is frozen (SIGSTOP), the next request of every
sequence is published to it, and it is killed (SIGKILL): none of those is answered by it. A
second worker takes the partitions once the group lets the dead member go: it replays what
was not committed, skipping the requests already answered (their states went to Redis with
their answers), and runs the rest on the states the answers left. Every sequence then ends
with the sums a single worker would have given (``workers/sequences.py``,
``workers/writer.py``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import redis.asyncio

from plaza.client import PlazaClient
from plaza.contract import InferResult
from plaza.stack import Deployment, wait_assignment
from tests.faults.processes import FaultProcesses
from tests.support import REPOSITORY, short_session

SEQUENCES, STEPS, KILL_AT = 16, 6, 3
"""Sequences side by side, their length, and the step in flight when the worker dies."""


def _params(key: int, i: int) -> dict[str, object]:
    return {"sequence_id": key, "sequence_start": i == 0, "sequence_end": i == STEPS - 1}


async def _step(client: PlazaClient, key: int, i: int) -> InferResult:
    x = {"INPUT": np.array([[i + 1]], np.int32)}
    return await client.infer("accumulate", x, parameters=_params(key, i), timeout_s=90)


@pytest.mark.timeout(180)
async def test_sequences_outlive_their_worker_killed_mid_flight(
    deployments: Callable[..., Deployment],
    processes: FaultProcesses,
    redis_for: Callable[[str], redis.asyncio.Redis],
    tmp_path: Path,
) -> None:
    repository = tmp_path / "repository"
    shutil.copytree(REPOSITORY / "accumulate", repository / "accumulate")
    deployment = short_session(deployments(repository=repository))
    victim = processes.worker(deployment, "a", model="accumulate")
    await victim.wait_registered()
    await wait_assignment([victim], deployment.partitions)
    keys = [900 + k for k in range(SEQUENCES)]
    answers: dict[int, list[InferResult]] = {key: [] for key in keys}
    async with PlazaClient(deployment.settings()) as client:
        for i in range(KILL_AT):  # the sequences' first steps, on the victim
            for key, result in zip(
                keys, await asyncio.gather(*(_step(client, k, i) for k in keys)), strict=True
            ):
                answers[key].append(result)
        pid = victim.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        x = {"INPUT": np.array([[KILL_AT + 1]], np.int32)}
        jobs = [  # each returns once Kafka has it: all in flight, none answered
            await client.submit("accumulate", x, parameters=_params(k, KILL_AT)) for k in keys
        ]
        victim.kill()
        killed_at = time.monotonic()
        survivor = processes.worker(deployment, "b", model="accumulate")
        for key, job in zip(keys, jobs, strict=True):
            answers[key].append(await client.result(job, timeout_s=90))
        recovered_s = time.monotonic() - killed_at
        for i in range(KILL_AT + 1, STEPS):  # the rest, on the survivor
            for key, result in zip(
                keys, await asyncio.gather(*(_step(client, k, i) for k in keys)), strict=True
            ):
                answers[key].append(result)
    state_keys = [deployment.names.sequence_state_key("accumulate", 1, k) for k in keys]
    kept = await redis_for(deployment.redis_url).exists(*state_keys)
    sums = [[int(r.outputs[0].to_numpy()[0, 0]) for r in run] for run in answers.values()]
    running = [sum(range(1, i + 2)) for i in range(STEPS)]  # 1, 3, 6, 10, 15, 21
    workers = [[r.worker for r in run] for run in answers.values()]
    at_kill = [run[KILL_AT] for run in workers]
    print(
        f"FAULT sequence_worker_kill: sequences={SEQUENCES} steps={STEPS} "
        f"taken_over={at_kill.count(survivor.worker_id)} recover_s={recovered_s:.1f}"
    )
    assert sums == [running] * SEQUENCES
    assert all(run[:KILL_AT] == [victim.worker_id] * KILL_AT for run in workers)
    assert all(run[KILL_AT:] == [survivor.worker_id] * (STEPS - KILL_AT) for run in workers)
    assert kept == 0  # every END dropped its sequence's state
