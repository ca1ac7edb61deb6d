"""Triton's per-response statistics of a decoupled model on real Kafka and Redis: real
workers count each response of ``repeat`` (tests/python_models.py) by its index, flush
them with their heartbeats into the version's statistics hash, where two workers' counts
add up, and the gateway serves them as ``response_stats`` over HTTP and gRPC (tritonclient);
a model that is not decoupled shows none."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import tritonclient.grpc as grpcclient

from plaza.client import PlazaClient
from plaza.contract import InferResult
from plaza.metrics import render
from plaza.naming import METRIC_FIRST_RESPONSE_HISTOGRAM
from plaza.settings import PlazaSettings
from tests.metrics_support import named, samples, value
from tests.python_models import write_repository
from tests.support import gateway_fronts, make_settings, running_worker


async def _stream(client: PlazaClient, values: list[int]) -> list[InferResult]:
    """Every response of one request to ``repeat`` (the SDK leaves the empty final out)."""
    inputs = {"IN": np.array([values], np.int32)}
    return [r async for r in client.infer_stream("repeat", inputs, raise_on_error=False)]


def _grpc_statistics(address: str) -> dict[str, Any]:
    client = grpcclient.InferenceServerClient(address)
    try:
        stats: dict[str, Any] = client.get_inference_statistics("repeat", "1", as_json=True)
        return stats
    finally:
        client.close()


async def test_response_stats_count_each_response_by_its_index(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path, redis_client: object
) -> None:
    root = write_repository(tmp_path / "repository", "repeat", "add_sub")
    settings: PlazaSettings = make_settings(kafka_bootstrap, redis_url, unique_id, repository=root)
    async with PlazaClient(settings) as client:
        # the first worker: 3 requests of 2 responses each, then the empty final
        async with running_worker(settings, "repeat") as first:
            answers = await asyncio.gather(*(_stream(client, [1, 2]) for _ in range(3)))
            assert [len(a) for a in answers] == [2, 2, 2]
            scraped = samples(render(first.metrics.registry).decode())
        async with running_worker(settings, "add_sub"):
            x = np.ones((1, 4), np.float32)
            await client.infer("add_sub", {"INPUT0": x, "INPUT1": x})
        # a second worker of the same version: 1 request whose second response is an error
        async with running_worker(settings, "repeat"):
            (ok, failed) = await _stream(client, [5, -1])
            assert ok.error is None and failed.error is not None

    # both workers stopped: their last flushes are in, the hash holds the sum
    async with gateway_fronts(settings) as gw:
        async with httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=60) as http:
            (stats,) = (await http.get("/v2/models/repeat/stats")).json()["model_stats"]
            (plain,) = (await http.get("/v2/models/add_sub/stats")).json()["model_stats"]
        over_grpc = await asyncio.to_thread(_grpc_statistics, gw.grpc_address)

    responses = stats["response_stats"]
    assert sorted(responses) == ["0", "1", "2"]

    def counts(index: str) -> dict[str, int]:
        return {phase: d["count"] for phase, d in responses[index].items()}

    assert counts("0") == {
        "compute_infer": 4,
        "compute_output": 4,
        "success": 4,
        "fail": 0,
        "empty_response": 0,
        "cancel": 0,
    }
    assert counts("1") == {
        "compute_infer": 4,
        "compute_output": 4,
        "success": 3,
        "fail": 1,
        "empty_response": 0,
        "cancel": 0,
    }
    assert counts("2") == {
        "compute_infer": 4,
        "compute_output": 0,  # the final flag alone: nothing to output
        "success": 0,
        "fail": 0,
        "empty_response": 4,
        "cancel": 0,
    }
    assert responses["0"]["success"]["ns"] > 0 and responses["2"]["empty_response"]["ns"] > 0
    assert stats["inference_stats"]["success"]["count"] == 4  # the requests, as before

    (grpc_stats,) = over_grpc["model_stats"]
    assert grpc_stats["response_stats"]["1"]["fail"]["count"] == "1"  # uint64: a JSON string
    assert grpc_stats["response_stats"]["2"]["empty_response"]["count"] == "4"
    assert grpc_stats["response_stats"]["0"]["success"]["count"] == "4"

    assert plain["inference_stats"]["success"]["count"] == 1
    assert plain["response_stats"] == {}  # not decoupled: no per-response statistics

    # the first worker's first-response histogram: one observation per request
    name = METRIC_FIRST_RESPONSE_HISTOGRAM
    assert value(scraped, f"{name}_count", model="repeat", version="1") == 3
    assert value(scraped, f"{name}_bucket", le="+Inf", model="repeat", version="1") == 3


async def test_model_metrics_sets_the_first_response_buckets(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path
) -> None:
    root = write_repository(tmp_path / "repository", "repeat")
    config = root / "repeat" / "config.pbtxt"
    config.write_text(
        config.read_text()
        + """
model_metrics {
  metric_control: [
    {
      metric_identifier: { family: "nv_inference_first_response_histogram_ms" }
      histogram_options: { buckets: [ 0.0001, 600000 ] }
    },
    {
      metric_identifier: { family: "nv_no_such_family" }
      histogram_options: { buckets: [ 1 ] }
    }
  ]
}
"""
    )
    settings: PlazaSettings = make_settings(kafka_bootstrap, redis_url, unique_id, repository=root)
    async with PlazaClient(settings) as client, running_worker(settings, "repeat") as worker:
        answers = await asyncio.gather(*(_stream(client, [1]) for _ in range(2)))
        assert [len(a) for a in answers] == [1, 1]
        scraped = samples(render(worker.metrics.registry).decode())

    name = f"{METRIC_FIRST_RESPONSE_HISTOGRAM}_bucket"
    bounds = sorted(dict(labels)["le"] for _, labels in named(scraped, name))
    assert bounds == sorted(["0.0001", "600000.0", "+Inf"])  # the config's, not Triton's
    assert value(scraped, name, le="0.0001", model="repeat", version="1") == 0
    assert value(scraped, name, le="600000.0", model="repeat", version="1") == 2
