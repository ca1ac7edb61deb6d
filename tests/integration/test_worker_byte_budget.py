"""A worker's memory is bounded in bytes, not only in records (``worker.max_pending_bytes``).

``max_pending`` alone allows 1024 records of up to 8 MiB each: 8 GiB. Here a backlog of
1 MiB requests waits in Kafka before a worker (a real subprocess, so its RSS is its own)
starts on a slow simulated device; the worker must stop fetching at its byte budget, answer
every request, and its peak pending bytes and RSS growth must stay within the budget.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis.asyncio

from plaza.client import PlazaClient, make_request
from plaza.codec import decode_result
from plaza.stack import Deployment, ProcessGroup, WorkerProcess, wait_for

MODEL = "big"
REQUESTS = 120
WIDTH = 256 * 1024  # FP32 elements: 1 MiB a request
BUDGET = 16 << 20
CONFIG = f"""
name: "{MODEL}"
backend: "plaza_simulated"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 1000 }}
parameters [ {{ key: "latency_a_us" value: {{ string_value: "20000" }} }} ]
"""


def vm_kib(pid: int, field: str) -> int:
    """``VmRSS`` / ``VmHWM`` (peak RSS) of a process, in KiB, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for pid {pid}")


async def worker_info(client: redis.asyncio.Redis, deployment: Deployment, wid: str) -> Any:
    raw = await client.get(deployment.names.worker_info_key(wid))
    return json.loads(raw) if raw else None


@pytest.mark.timeout(180)
async def test_worker_stops_fetching_at_its_byte_budget(
    kafka_bootstrap: str,
    redis_url: str,
    unique_id: str,
    redis_client: redis.asyncio.Redis,  # deletes this test's keys afterwards
    tmp_path: Path,
) -> None:
    (tmp_path / "repo" / MODEL / "1").mkdir(parents=True)
    (tmp_path / "repo" / MODEL / "config.pbtxt").write_text(CONFIG)
    deployment = Deployment(kafka_bootstrap, redis_url, tmp_path / "repo", unique_id, partitions=2)
    env = {
        "PLAZA_WORKER__MAX_PENDING_BYTES": str(BUDGET),
        "PLAZA_WORKER__INTRA_OP_THREADS": "1",
        "PLAZA_WORKER__DEVICE": "cpu",
    }
    async with PlazaClient(deployment.settings()) as client:
        rows = [np.full((1, WIDTH), i, dtype=np.float32) for i in range(REQUESTS)]
        ids = await client.publish_many(make_request(MODEL, {"INPUT0": r}) for r in rows)
        group = ProcessGroup(tmp_path / "logs")
        try:
            worker = group.start(WorkerProcess(deployment, MODEL, group.log_dir, env=env))
            await worker.wait_registered()
            assert worker.pid is not None
            pid, base_kib = worker.pid, vm_kib(worker.pid, "VmRSS")
            keys = [deployment.names.result_key(rid) for rid in ids]

            async def answered() -> bool:
                return int(await redis_client.exists(*keys)) == len(keys)

            await wait_for(answered, 120, "every answer", worker.tail)
            results = [decode_result(raw) for raw in await redis_client.mget(keys)]
            peak_kib = vm_kib(pid, "VmHWM")

            async def idle() -> Any:  # a heartbeat written after the load
                info = await worker_info(redis_client, deployment, worker.worker_id)
                done = info and info["pending"] == 0 and info["peak_pending_bytes"] > 0
                return info if done else None

            await wait_for(idle, 30, "the worker's heartbeat after the load", worker.tail)
            info = await idle()
        finally:
            group.stop_all()
    for i, res in enumerate(results):
        assert res.error is None and res.output("OUTPUT0").to_numpy()[0, 0] == i
    record = WIDTH * 4 + 1024  # one request record: its tensor plus the envelope
    assert info["peak_pending_bytes"] <= BUDGET + record, info
    assert info["pending_bytes"] == 0
    # Far below the backlog (120 MiB) it held without the budget (RSS +180 MiB then; about
    # +35 MiB now): the budget, the fetcher's read-ahead (a quarter of the budget) and one
    # stacked batch (8 MiB).
    assert (peak_kib - base_kib) * 1024 < BUDGET * 4, (base_kib, peak_kib)
