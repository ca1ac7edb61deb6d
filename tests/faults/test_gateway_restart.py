"""Fault 5: the gateway process killed and started again while async jobs are pending.

Jobs are submitted over HTTP (``POST /v2/models/identity/jobs``) with no worker running, so
they wait in Kafka (the request) and Redis (the job marker). The gateway is killed with -9
and a new one is started on the same port; only then is a worker started. What it shows:
a gateway holds no job state of its own; every job completes and is polled through the new
gateway (``GET /v2/jobs/{id}``), exactly one answer per job, each correct.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any

import httpx
import numpy as np
import pytest
import redis.asyncio

from plaza.stack import Deployment, free_port, wait_for
from tests.faults.audit import FaultReport, correct, read_result_keys, wait_drained
from tests.faults.harness import value
from tests.faults.processes import FaultProcesses

JOBS = 300
CONCURRENCY = 8


def job_body(i: int) -> dict[str, Any]:
    data = value(i)
    return {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": list(data.shape),
                "datatype": "FP32",
                "data": data.reshape(-1).tolist(),
            }
        ]
    }


def http_answer(doc: dict[str, Any]) -> np.ndarray[Any, Any] | None:
    """OUTPUT0 of a done job's poll response (None if it is not a well-formed ok answer)."""
    if doc.get("status") != "done":
        return None
    outputs = {o.get("name"): o for o in doc.get("outputs", [])}
    out = outputs.get("OUTPUT0")
    if out is None or out.get("datatype") != "FP32":
        return None
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


class Jobs:
    """Submits and polls jobs over HTTP, at most CONCURRENCY requests at a time."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http
        self.gate = asyncio.Semaphore(CONCURRENCY)  # two cores: no stampede

    async def submit(self, url: str, i: int) -> str:
        async with self.gate:
            response = await self.http.post(f"{url}/v2/models/identity/jobs", json=job_body(i))
        assert response.status_code == 202, response.text
        return str(response.json()["job_id"])

    async def poll(self, url: str, job_id: str) -> dict[str, Any]:
        async with self.gate:
            response = await self.http.get(f"{url}/v2/jobs/{job_id}")
        assert response.status_code == 200, response.text
        doc: dict[str, Any] = response.json()
        return doc

    async def poll_all(self, url: str, ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        ids = list(ids)
        docs = await asyncio.gather(*(self.poll(url, j) for j in ids))
        return dict(zip(ids, docs, strict=True))


def same(a: np.ndarray[Any, Any] | None, b: np.ndarray[Any, Any] | None) -> bool:
    return a is not None and b is not None and np.array_equal(a, b)


@pytest.mark.timeout(150)
async def test_gateway_restarted_with_jobs_pending(
    deployments: Callable[..., Deployment],
    processes: FaultProcesses,
    redis_for: Callable[[str], redis.asyncio.Redis],
    record_fault: Callable[[FaultReport], None],
) -> None:
    deployment = deployments()
    port = free_port()
    async with httpx.AsyncClient(timeout=10.0, trust_env=False) as http:
        jobs = Jobs(http)
        old = processes.gateway(deployment, port, "gateway-1")
        await old.wait_live()
        ids = await asyncio.gather(*(jobs.submit(old.url, i) for i in range(JOBS)))
        expected = {job_id: value(i) for i, job_id in enumerate(ids)}
        assert len(expected) == JOBS
        before = await jobs.poll_all(old.url, ids[:20])
        assert {d["status"] for d in before.values()} == {"pending"}

        old.kill()
        fault_at = time.monotonic()
        new = processes.gateway(deployment, port, "gateway-2")
        await new.wait_live()
        new_live_s = time.monotonic() - fault_at
        pending = await jobs.poll_all(new.url, ids)
        assert {d["status"] for d in pending.values()} == {"pending"}, "jobs lost with gateway-1"

        worker = processes.worker(deployment, "w")
        first: dict[str, np.ndarray[Any, Any] | None] = {}  # job id -> first answer polled

        async def all_done() -> bool:
            worker.check()
            polled = await jobs.poll_all(new.url, [j for j in ids if j not in first])
            first.update({j: http_answer(d) for j, d in polled.items() if d["status"] != "pending"})
            return len(first) == JOBS

        await wait_for(
            all_done,
            90,
            "every job done through gateway-2",
            lambda: f"{len(first)}/{JOBS} done\n{worker.tail()}",
        )
        recover_s = time.monotonic() - fault_at
        again = await jobs.poll_all(new.url, ids)
    await wait_drained(deployment)

    keys = await read_result_keys(redis_for(deployment.redis_url), deployment.names, ids)
    wrong = {j for j in ids if not same(first.get(j), expected[j])}
    wrong |= {j for j, res in keys.items() if not correct(res, expected[j])}
    changed = [j for j in ids if not same(http_answer(again[j]), first.get(j))]
    report = FaultReport(
        "gateway_restart",
        JOBS,
        len(set(first) & set(keys)),
        len(changed),
        len(wrong),
        recover_s,
        {
            "polled_done": len(first),
            "key_answers": len(keys),
            "new_gateway_live_s": f"{new_live_s:.1f}",
        },
    )
    record_fault(report)
    report.check()
