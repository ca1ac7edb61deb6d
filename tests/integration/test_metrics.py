"""Metrics and Triton's statistics API on real Kafka and Redis, through a real worker.

Requests go through the HTTP gateway (its HTTP server on a free port) to a worker of ``identity``;
the worker's /metrics is found through its info key in Redis, and the statistics the
worker flushes with its heartbeat (and once more when it stops) are read back through the
gateway's ``/v2/models/.../stats``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import msgspec
import numpy as np
import redis.asyncio

from plaza.client import PlazaClient, make_request
from plaza.gateway.statistics import read_statistics
from plaza.metrics import render
from plaza.naming import Names
from plaza.settings import PlazaSettings
from plaza.workers.device import list_gpus
from plaza.workers.gpu_metrics import GpuCollector
from plaza.workers.metrics import WorkerMetrics
from plaza.workers.runner import WorkItem
from tests.metrics_support import named, samples, value
from tests.support import REPOSITORY, gateway_fronts, make_settings, running_worker, wait_for

N = 12
MODEL = "identity"


@asynccontextmanager
async def gateway(settings: PlazaSettings) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    """The gateway on a free port: an HTTP client for it, and its app."""
    async with (
        gateway_fronts(settings) as running,
        httpx.AsyncClient(base_url=running.http_url, trust_env=False, timeout=60) as client,
    ):
        yield client, running.app


def identity_json(x: np.ndarray[Any, Any], name: str = "INPUT0") -> dict[str, Any]:
    return {
        "inputs": [{"name": name, "datatype": "FP32", "shape": list(x.shape), "data": x.tolist()}]
    }


async def test_stats_and_metrics_after_requests_through_a_real_worker(
    kafka_bootstrap: str,
    redis_url: str,
    unique_id: str,
    tmp_path: Path,
    redis_client: redis.asyncio.Redis,
) -> None:
    shutil.copytree(REPOSITORY / MODEL, tmp_path / MODEL)
    settings = make_settings(kafka_bootstrap, redis_url, unique_id, repository=tmp_path)
    names = settings.names
    async with gateway(settings) as (client, app), PlazaClient(settings) as sdk:
        async with running_worker(settings, MODEL) as worker:
            rows = [np.full((1, 4), i, dtype=np.float32) for i in range(N)]
            answers = await asyncio.gather(
                *(client.post(f"/v2/models/{MODEL}/infer", json=identity_json(r)) for r in rows)
            )
            assert [a.status_code for a in answers] == [200] * N
            bad = await client.post(
                f"/v2/models/{MODEL}/infer", json=identity_json(rows[0], "NOPE")
            )
            assert bad.status_code == 400  # refused by the gateway: counted there, not here
            fresh = make_request(MODEL, {"INPUT0": rows[0]}, timeout_s=600)
            past = msgspec.structs.replace(fresh, deadline_ms=fresh.created_ms - 60_000)
            [late] = await sdk.publish_many([past])

            async def answered() -> bool:  # publish_many writes no job marker: unknown first
                return (await sdk.poll(late)).state == "done"

            await wait_for(answered, 30, "the expired request's answer")
            expired = await sdk.result(late, raise_on_error=False)
            assert expired.error is not None and expired.error.code == "timeout"

            # the worker's /metrics, found through its info key
            info = json.loads(await redis_client.get(names.worker_info_key(worker.id)))
            port = info["metrics_port"]
            assert port == worker.metrics.port and port > 0
            async with httpx.AsyncClient(trust_env=False, timeout=30) as scraper:
                scrape = await scraper.get(f"http://127.0.0.1:{port}/metrics")
            assert scrape.status_code == 200
            got = samples(scrape.text)
            v1 = {"model": MODEL, "version": "1"}
            assert value(got, "nv_inference_count", **v1) == N
            assert value(got, "nv_inference_request_success", **v1) == N
            assert value(got, "nv_inference_request_failure", reason="REJECTED", **v1) == 1
            executions = value(got, "nv_inference_exec_count", **v1)
            assert executions is not None and 1 <= executions <= N
            assert value(got, "plaza_inference_batch_size_count", **v1) == executions
            assert value(got, "plaza_inference_batch_size_sum", **v1) == N
            assert value(got, "nv_inference_pending_request_count", **v1) == 0
            lags = named(got, "plaza_kafka_consumer_lag")
            assert lags and all(v >= 0 for v in lags.values())
            # the host's CPU and memory, as Triton reports them (workers/cpu_metrics.py)
            total = value(got, "nv_cpu_memory_total_bytes")
            assert total is not None and 0 < (value(got, "nv_cpu_memory_used_bytes") or 0) < total
            if not list_gpus():
                assert not any(name.startswith("nv_gpu") for name, _ in got)

        # the worker stopped: its last flush is in, so the sums are exact now
        response = await client.get(f"/v2/models/{MODEL}/stats")
        assert response.status_code == 200, response.text
        (stats,) = response.json()["model_stats"]
        assert stats["name"] == MODEL and stats["version"] == "1"
        assert stats["inference_count"] == N and stats["execution_count"] == executions
        assert stats["last_inference"] > 0
        inference = stats["inference_stats"]
        for phase in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
            assert inference[phase]["count"] == N, phase
        assert inference["success"]["ns"] >= inference["queue"]["ns"] >= 0
        assert inference["fail"]["count"] == 1
        batches = stats["batch_stats"]
        assert sum(b["batch_size"] * b["compute_infer"]["count"] for b in batches) == N
        assert sum(b["compute_infer"]["count"] for b in batches) == executions

        everything = (await client.get("/v2/models/stats")).json()["model_stats"]
        assert everything == [stats]
        assert (await client.get(f"/v2/models/{MODEL}/versions/1/stats")).json() == {
            "model_stats": [stats]
        }
        assert (await client.get(f"/v2/models/{MODEL}/versions/2/stats")).status_code == 404
        assert await redis_client.ttl(names.model_stats_key(MODEL, "1")) > 0

        # the gateway's own counters
        mine = samples(render(app.state.service.metrics.registry).decode())
        assert value(mine, "nv_inference_request_success", **v1) == N
        assert value(mine, "nv_inference_request_failure", reason="OTHER", **v1) == 1


def _ok(rows: int) -> tuple[WorkItem, Any]:
    from plaza.client import make_request
    from plaza.contract import InferResult

    x = np.zeros((rows, 4), dtype=np.float32)
    item = WorkItem(request=make_request(MODEL, {"INPUT0": x}), rows=rows, version=1)
    timing = {"queue": 7, "compute_input": 1, "compute_infer": 3, "compute_output": 1}
    return item, InferResult(id=item.request.id, model=MODEL, version="1", timing_us=timing)


async def test_workers_statistics_add_up_in_one_hash(
    settings: PlazaSettings, redis_client: redis.asyncio.Redis
) -> None:
    """Two workers' flushes sum; a flush with nothing new adds nothing."""
    names: Names = settings.names
    workers = [
        WorkerMetrics(
            MODEL,
            names,
            settings.worker.model_copy(update={"metrics_port": -1}),
            stats_ttl_s=60,
            gpu=GpuCollector(nvml=object()),
        )
        for _ in range(2)
    ]
    for w, rows in zip(workers, (2, 3), strict=True):
        w.start([1], pending=lambda: 0)
        item, result = _ok(rows)
        w.executed([item], [result])
        w.answered([(result, None)])
        await w.flush_with(redis_client.pipeline(transaction=False))
        await w.flush_with(redis_client.pipeline(transaction=False))  # nothing new
    models = {MODEL: SimpleNamespace(versions=(1,))}
    body = await read_statistics(redis_client, names, models)  # type: ignore[arg-type]
    (stats,) = body["model_stats"]
    assert stats["inference_count"] == 5 and stats["execution_count"] == 2
    assert stats["inference_stats"]["success"] == {"count": 2, "ns": 24_000}
    assert stats["last_inference"] == max(w.stats["1"].last_inference for w in workers)
    assert [b["batch_size"] for b in stats["batch_stats"]] == [2, 3]
    assert 0 < await redis_client.ttl(names.model_stats_key(MODEL, "1")) <= 60
    for w in workers:
        await w.close(redis_client)


async def test_a_worker_serves_tritons_latency_summaries_when_asked(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path
) -> None:
    """``worker.summary_latencies``: the worker's /metrics holds Triton's five summaries,
    each request answered counted once, quantiles within the requests' own timings."""
    shutil.copytree(REPOSITORY / MODEL, tmp_path / MODEL)
    worker_settings = {"summary_latencies": True, "summary_quantiles": "0.5:0.05,0.99:0.001"}
    settings = make_settings(
        kafka_bootstrap, redis_url, unique_id, repository=tmp_path, worker=worker_settings
    )
    async with PlazaClient(settings) as sdk, running_worker(settings, MODEL) as worker:
        rows = [np.full((1, 4), i, dtype=np.float32) for i in range(N)]
        results = await asyncio.gather(*(sdk.infer(MODEL, {"INPUT0": r}) for r in rows))
        async with httpx.AsyncClient(trust_env=False, timeout=30) as scraper:
            scrape = await scraper.get(f"http://127.0.0.1:{worker.metrics.port}/metrics")
    assert scrape.status_code == 200
    got = samples(scrape.text)
    v1 = {"model": MODEL, "version": "1"}
    totals = sorted(sum(r.timing_us.values()) for r in results)
    for phase in ("request", "queue", "compute_input", "compute_infer", "compute_output"):
        name = f"nv_inference_{phase}_summary_us"
        assert value(got, f"{name}_count", **v1) == N
    assert value(got, "nv_inference_request_summary_us_sum", **v1) == sum(totals)
    median = value(got, "nv_inference_request_summary_us", quantile="0.5", **v1)
    p99 = value(got, "nv_inference_request_summary_us", quantile="0.99", **v1)
    assert median in totals and p99 == totals[-1]  # each from the requests' own times
    assert "# TYPE nv_inference_request_summary_us summary" in scrape.text
