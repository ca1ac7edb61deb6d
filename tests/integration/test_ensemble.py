"""Ensembles end to end: SDK / raw Kafka / HTTP -> the ensemble's topic -> its runner -> each
step's topic and worker -> Redis, on the real Kafka and Redis.

The repository is the test's own: identity and add_sub (ONNX), and simulated INT32 and
fixed-width copies, plus three ensembles over them: ``chain`` (identity -> identity),
``fan`` (add_sub -> two copies side by side -> add_sub: fan-out and fan-in) and ``strict``
(identity -> a model whose fixed width a request can miss: a step error).
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc.aio as aioclient
from aiokafka import AIOKafkaProducer
from tritonclient.utils import InferenceServerException

from plaza.client import PlazaClient, make_request
from plaza.codec import encode_request
from plaza.contract import InferResult
from plaza.errors import PlazaError
from plaza.naming import step_request_id
from plaza.publisher import request_headers
from plaza.results import ResultStore
from plaza.settings import PlazaSettings
from plaza.statistics import ModelStatistics
from plaza.workers.ensemble import EnsembleRunner
from plaza.workers.host import Host
from plaza.workers.worker import Worker
from tests.ensemble_configs import FOUR
from tests.support import REPOSITORY, running_worker, wait_for, with_model
from tests.support import gateway_fronts as both_fronts

COPY_I32 = """
name: "copy"
backend: "plaza_simulated"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
dynamic_batching { max_queue_delay_microseconds: 5000 }
"""
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
FAN = """
name: "fan"
platform: "ensemble"
max_batch_size: 64
input [
  { name: "X" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "Y" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "TWO_X" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "TWO_Y" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "SUM" data_type: TYPE_INT32 dims: [ 16 ] }
]
ensemble_scheduling {
  step [
    {
      model_name: "add_sub"
      model_version: -1
      input_map { key: "INPUT0" value: "X" }
      input_map { key: "INPUT1" value: "Y" }
      output_map { key: "OUTPUT0" value: "SUM" }
      output_map { key: "OUTPUT1" value: "DIFF" }
    },
    {
      model_name: "copy"
      model_version: -1
      input_map { key: "INPUT0" value: "SUM" }
      output_map { key: "OUTPUT0" value: "SUM2" }
    },
    {
      model_name: "copy"
      model_version: -1
      input_map { key: "INPUT0" value: "DIFF" }
      output_map { key: "OUTPUT0" value: "DIFF2" }
    },
    {
      model_name: "add_sub"
      model_version: -1
      input_map { key: "INPUT0" value: "SUM2" }
      input_map { key: "INPUT1" value: "DIFF2" }
      output_map { key: "OUTPUT0" value: "TWO_X" }
      output_map { key: "OUTPUT1" value: "TWO_Y" }
    }
  ]
}
"""
STRICT = """
name: "strict"
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
      model_name: "four"
      model_version: -1
      input_map { key: "INPUT0" value: "middle" }
      output_map { key: "OUTPUT0" value: "OUTPUT0" }
    }
  ]
}
"""
CONFIGS = {"copy": COPY_I32, "four": FOUR, "chain": CHAIN, "fan": FAN, "strict": STRICT}


def ensemble_repository(make_repository: Callable[..., Path]) -> Path:
    """identity and add_sub (built), the simulated copies, and the ensembles (`1/` empty)."""
    root = make_repository("identity", "add_sub")
    for name, config in CONFIGS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
    return root


@asynccontextmanager
async def serving(
    settings: PlazaSettings, workers: list[str], ensembles: list[str]
) -> AsyncIterator[dict[str, Worker]]:
    """Workers of ``workers`` (yielded by model) and runners of ``ensembles``."""
    async with AsyncExitStack() as stack:
        started = await asyncio.gather(
            *(stack.enter_async_context(running_worker(settings, m)) for m in workers)
        )
        for ensemble in ensembles:
            runner = EnsembleRunner(with_model(settings, ensemble))
            await runner.start()
            stack.push_async_callback(runner.stop)
        yield dict(zip(workers, started, strict=True))


def ints(seed: int) -> np.ndarray[Any, Any]:
    return (np.arange(16, dtype=np.int32) * (seed + 1)).reshape(1, 16)


async def test_chain_and_fan_answer_through_the_sdk_and_raw_kafka(
    settings: PlazaSettings, make_repository: Callable[..., Path], redis_client: Any
) -> None:
    settings = settings.model_copy(update={"repository": ensemble_repository(make_repository)})
    async with (
        serving(settings, ["identity", "add_sub", "copy"], ["chain", "fan"]) as workers,
        PlazaClient(settings) as client,
    ):
        x = np.array([[1.0, 2.5, -3.0]], dtype=np.float32)
        chained = await client.infer("chain", {"INPUT0": x})
        assert chained.model == "chain" and chained.version == "1"
        np.testing.assert_array_equal(chained.output("OUTPUT0").to_numpy(), x)

        a, b = ints(1), ints(0) + 7
        fanned = (await client.infer("fan", {"X": a, "Y": b})).as_numpy()
        np.testing.assert_array_equal(fanned["TWO_X"], 2 * a)  # (a+b) + (a-b)
        np.testing.assert_array_equal(fanned["TWO_Y"], 2 * b)  # (a+b) - (a-b)
        np.testing.assert_array_equal(fanned["SUM"], a + b)  # also fed steps 1 and 3

        # A raw Kafka producer: the envelope straight to the ensemble's topic.
        req = make_request("fan", {"X": a, "Y": a}, correlation_id="raw-fan-1")
        raw = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
        await raw.start()
        try:
            await raw.send_and_wait(
                settings.names.request_topic("fan"),
                encode_request(req),
                key=req.id.encode(),
                headers=request_headers(req),
            )
        finally:
            await raw.stop()
        store = ResultStore(redis_client, settings.redis, settings.names)
        result = await _stored(store, "raw-fan-1")
        np.testing.assert_array_equal(result.output("TWO_X").to_numpy(), 2 * a)
        np.testing.assert_array_equal(result.output("TWO_Y").to_numpy(), 2 * a)
        # Its intermediate answers are the steps' own, under their step ids.
        first = (await store.poll(step_request_id("raw-fan-1", 0))).result
        assert first is not None and first.model == "add_sub"
        np.testing.assert_array_equal(first.output("OUTPUT1").to_numpy(), np.zeros_like(a))

        # A burst: every step model batches on its own queue depth.
        burst = [
            make_request("fan", {"X": ints(i), "Y": ints(i + 1)}, reply_stream=None)
            for i in range(96)
        ]
        ids = await client.publish_many(burst)
        answers = [await _stored(store, i) for i in ids]
        for i, res in enumerate(answers):
            np.testing.assert_array_equal(res.output("TWO_X").to_numpy(), 2 * ints(i))
        # Each step model's worker batched (its plaza_inference_batch_size histogram), and
        # its batch sizes reach the statistics API's hash with the worker's heartbeat.
        for model in ("add_sub", "copy"):
            assert max(workers[model].metrics.batch_sizes()) > 1, model
            await wait_for(
                lambda m=model: _batched(redis_client, settings, m), 30, f"{model} batches > 1"
            )
        await wait_for(lambda: _successes(redis_client, settings, "fan"), 30, "fan's statistics")


async def _stored(store: ResultStore, correlation_id: str) -> InferResult:
    """The answer under ``correlation_id``'s result key, once there (raw publishes and
    pipelines have no job marker to poll)."""
    found: list[InferResult] = []

    async def done() -> bool:
        status = await store.poll(correlation_id)
        if status.result is not None:
            found.append(status.result)
        return bool(found)

    await wait_for(done, 60, f"the answer of {correlation_id}")
    return found[0]


async def _batched(redis_client: Any, settings: PlazaSettings, model: str) -> bool:
    """Whether ``model``'s statistics show an execution of more than one request."""
    raw = await redis_client.hgetall(settings.names.model_stats_key(model, "1"))
    return max(ModelStatistics.from_fields(raw).batches, default=0) > 1


async def _successes(redis_client: Any, settings: PlazaSettings, model: str) -> bool:
    """Whether the ensemble's own statistics count its 98 answers (the runner's)."""
    raw = await redis_client.hgetall(settings.names.model_stats_key(model, "1"))
    return ModelStatistics.from_fields(raw).success.count >= 98


async def test_gateway_serves_an_ensemble_and_a_step_error_names_the_step(
    settings: PlazaSettings, make_repository: Callable[..., Path], redis_client: Any
) -> None:
    settings = settings.model_copy(update={"repository": ensemble_repository(make_repository)})
    gateway = settings.gateway.model_copy(update={"models": "chain,strict"})
    settings = settings.model_copy(update={"gateway": gateway})
    async with (
        both_fronts(settings) as gw,
        httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=60) as api,
    ):
        meta = (await api.get("/v2/models/chain")).json()
        assert meta["platform"] == "ensemble"
        assert [i["name"] for i in meta["inputs"]] == ["INPUT0"]
        config = (await api.get("/v2/models/chain/config")).json()
        assert len(config["ensemble_scheduling"]["step"]) == 2
        async with serving(settings, ["four"], ["chain", "strict"]):
            # Runners live, but identity (chain's steps) has no worker: not ready.
            await wait_for(lambda: _runner_registered(redis_client, settings), 30, "runners")
            assert (await api.get("/v2/models/chain/ready")).status_code != 200
            assert (await api.get("/v2/models/strict/ready")).status_code != 200
            async with running_worker(settings, "identity"):
                await wait_for(lambda: _ready(api, "chain"), 30, "chain ready")
                assert (await api.get("/v2/health/ready")).status_code == 200
                x = [[1.0, 2.0, 3.0]]
                body = {
                    "inputs": [
                        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 3], "data": x[0]}
                    ]
                }
                ok = await api.post("/v2/models/chain/infer", json=body)
                assert ok.status_code == 200, ok.text
                assert ok.json()["outputs"][0]["data"] == x[0]
                bad = await api.post("/v2/models/strict/infer", json=body)
                assert bad.status_code == 400, bad.text  # invalid_input, the step's code
                assert bad.json()["error"].startswith("step 1 (model 'four'): ")
                assert "does not match dims [4]" in bad.json()["error"]
                await _grpc_checks(gw.grpc_address)
                # The ensemble's own statistics, from its runner: the HTTP and gRPC calls.
                await wait_for(lambda: _stats_success(api, "chain", 2), 30, "chain's statistics")


async def _grpc_checks(address: str) -> None:
    """The same ensemble over gRPC: metadata, an answer, and a step error's status."""
    client = aioclient.InferenceServerClient(address)
    try:
        meta = await client.get_model_metadata("chain", as_json=True)
        assert meta["platform"] == "ensemble"
        x = np.array([[4.0, -1.0]], dtype=np.float32)
        item = aioclient.InferInput("INPUT0", [1, 2], "FP32")
        item.set_data_from_numpy(x)
        result = await client.infer("chain", [item])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
        with pytest.raises(InferenceServerException, match=r"step 1 \(model 'four'\)"):
            await client.infer("strict", [item])
    finally:
        await client.close()


async def _stats_success(api: httpx.AsyncClient, model: str, at_least: int) -> bool:
    stats = (await api.get(f"/v2/models/{model}/stats")).json()["model_stats"][0]
    return int(stats["inference_stats"]["success"]["count"]) >= at_least


async def _runner_registered(redis_client: Any, settings: PlazaSettings) -> bool:
    keys = [settings.names.worker_registry_key(m) for m in ("chain", "strict")]
    return all([await redis_client.zcard(k) for k in keys])


async def _ready(api: httpx.AsyncClient, model: str) -> bool:
    return (await api.get(f"/v2/models/{model}/ready")).status_code == 200


async def test_one_host_serves_an_ensemble_and_its_steps(
    settings: PlazaSettings, make_repository: Callable[..., Path]
) -> None:
    """``plaza worker --host.models chain,identity``: the ensemble's unit is a runner."""
    settings = settings.model_copy(update={"repository": ensemble_repository(make_repository)})
    hosted = settings.model_copy(
        update={"host": settings.host.model_copy(update={"models": "chain,identity"})}
    )
    host = Host(hosted)
    await host.start()
    try:
        kinds = {type(unit).__name__ for unit in host.workers}
        async with PlazaClient(settings) as client:
            x = np.array([[4.0, -1.5]], dtype=np.float32)
            answer = await client.infer("chain", {"INPUT0": x})
    finally:
        await host.stop()
    assert kinds == {"EnsembleRunner", "Worker"}
    np.testing.assert_array_equal(answer.output("OUTPUT0").to_numpy(), x)


RUNNING = """
name: "running"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "TOTAL" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "accumulate"
      model_version: -1
      input_map { key: "INPUT" value: "X" }
      output_map { key: "OUTPUT" value: "TOTAL" }
    }
  ]
}
"""


async def test_an_ensemble_over_a_stateful_model_runs_sequences(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    """A step inherits the ensemble request's parameters: its ``sequence_id`` and flags reach
    the stateful step, whose requests the producer core sends to the sequence's partition.
    Two sequences through the ensemble, interleaved, each keep their own running sum."""
    root = tmp_path / "repository"
    shutil.copytree(REPOSITORY / "accumulate", root / "accumulate")  # the sample, built
    (root / "running" / "1").mkdir(parents=True)
    (root / "running" / "config.pbtxt").write_text(RUNNING)
    settings = settings.model_copy(update={"repository": root})
    sums: dict[int, list[int]] = {5: [], 6: []}
    async with serving(settings, ["accumulate"], ["running"]), PlazaClient(settings) as client:
        for i in range(4):
            for key, step in ((5, 1), (6, 10)):
                params = {"sequence_id": key, "sequence_start": i == 0, "sequence_end": i == 3}
                x = {"X": np.array([[step]], np.int32)}
                result = await client.infer("running", x, parameters=params)
                sums[key].append(int(result.output("TOTAL").to_numpy()[0, 0]))
        # after its END, a sequence's next request is refused by the step, named
        after = {"sequence_id": 5}
        with pytest.raises(PlazaError, match=r"accumulate.*has not started"):
            await client.infer("running", {"X": np.array([[1]], np.int32)}, parameters=after)
    assert sums == {5: [1, 2, 3, 4], 6: [10, 20, 30, 40]}
