"""Fault 1: kill -9 one of two workers of a consumer group in the middle of the load.

What it shows: the records the dead worker had fetched but not committed are replayed by
the survivor once the group notices (session timeout), and every request is still answered
exactly once: the result keys hold one correct answer per correlation id, and the result
stream holds no second entry for any id (first write wins, the stream is written only on a
first write).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from plaza.connections import key_partition
from plaza.stack import Deployment, wait_assignment
from tests.faults.audit import FaultReport
from tests.faults.processes import FaultProcesses
from tests.faults.under_load import FaultRun, run_fault_under_load
from tests.support import short_session

REQUESTS = 3000
SLOW_IDENTITY = """
name: "identity"
backend: "plaza_simulated"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 1000 }
parameters [ { key: "latency_a_us" value: { string_value: "2000" } } ]
"""
"""The identity model at 2 ms a row (the simulated device: a copy of the input, no CPU):
the load then lasts seconds, so the kill always lands in it. The ONNX identity answers
3000 requests faster than the test can see the first of them on a busy machine."""


def slow_identity_repository(root: Path) -> Path:
    (root / "identity" / "1").mkdir(parents=True)
    (root / "identity" / "config.pbtxt").write_text(SLOW_IDENTITY)
    return root


def taken_over(
    sent_at: Mapping[str, float],
    first_seen: Mapping[str, float],
    victim_partitions: set[int],
    partitions: int,
    fault_at: float,
) -> int:
    """Requests on the victim's partitions answered only after it died (by the survivor).

    The partition is the producer's own choice for the key (the correlation id).
    """
    every = list(range(partitions))
    return sum(
        1
        for rid in sent_at
        if key_partition(rid.encode(), every, every) in victim_partitions
        and first_seen.get(rid, float("inf")) > fault_at
    )


@pytest.mark.timeout(150)
async def test_worker_killed_mid_flight(
    deployments: Callable[..., Deployment],
    processes: FaultProcesses,
    record_fault: Callable[[FaultReport], None],
    tmp_path: Path,
) -> None:
    repository = slow_identity_repository(tmp_path / "repository")
    deployment = short_session(deployments(repository=repository))
    victim, survivor = processes.worker(deployment, "a"), processes.worker(deployment, "b")
    await asyncio.gather(victim.wait_registered(), survivor.wait_registered())
    await wait_assignment([victim, survivor], deployment.partitions)
    victim_partitions = victim.assignment() or set()

    async def kill_victim(run: FaultRun) -> dict[str, Any]:
        victim.kill()
        return {}

    def who_answered(run: FaultRun) -> dict[str, Any]:
        tail = run.tail
        moved = taken_over(
            run.load.sent_at,
            tail.first_seen,
            victim_partitions,
            deployment.partitions,
            run.fault_at,
        )
        by_victim, by_survivor = (tail.by_worker[w.worker_id] for w in (victim, survivor))
        return {"taken_over": moved, "by_victim": by_victim, "by_survivor": by_survivor}

    report = await run_fault_under_load(
        deployment,
        [victim, survivor],
        name="worker_kill",
        fault=kill_victim,
        requests=REQUESTS,
        rate=1e6,  # one publish_many: most requests are still open when the victim dies
        chunk=REQUESTS,
        # Kill the victim as soon as it is busy.
        strike_when=lambda run: run.tail.by_worker[victim.worker_id] >= 20,
        extra_details=who_answered,
        answer_limit_s=90,
    )
    record_fault(report)
    assert report.details["open_at_fault"] >= REQUESTS // 3, "the kill missed the load"
    assert report.details["taken_over"] > 0, "the victim left nothing for the survivor"
    report.check()
