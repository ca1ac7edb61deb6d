"""An ensemble's own executions, on the real Kafka and Redis, as Triton's ensemble scheduler
counts them: each request that succeeds is one execution of its rows (inference and
execution counts, a batch_stats entry of its batch size); a request that fails counts none.

The ensemble has one step, a simulated model of fixed width 4, so a request 3 wide passes
the ensemble's own check (dims [-1]) and fails at the step.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import redis.asyncio

from plaza.client import PlazaClient
from plaza.gateway.statistics import read_statistics
from plaza.settings import PlazaSettings
from plaza.workers.ensemble import EnsembleRunner
from tests.ensemble_configs import FOUR
from tests.metrics_support import samples, value
from tests.support import running_worker, with_model

ENSEMBLE = """
name: "ens"
platform: "ensemble"
max_batch_size: 64
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "four"
      model_version: -1
      input_map { key: "INPUT0" value: "X" }
      output_map { key: "OUTPUT0" value: "Y" }
    }
  ]
}
"""
ROWS = (1, 1, 1, 1, 3)


def repository(root: Path) -> Path:
    for name, config in (("four", FOUR), ("ens", ENSEMBLE)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
    return root


async def scrape(port: int | None) -> dict[Any, float]:
    assert port is not None and port > 0
    async with httpx.AsyncClient(trust_env=False, timeout=30) as scraper:
        answer = await scraper.get(f"http://127.0.0.1:{port}/metrics")
    assert answer.status_code == 200
    return samples(answer.text)


async def test_each_ensemble_request_that_succeeds_is_one_execution_of_its_rows(
    settings: PlazaSettings, tmp_path: Path, redis_client: redis.asyncio.Redis
) -> None:
    settings = settings.model_copy(update={"repository": repository(tmp_path / "repo")})
    runner = EnsembleRunner(with_model(settings, "ens"))
    async with running_worker(settings, "four"), PlazaClient(settings) as sdk:
        await runner.start()
        try:
            for rows in ROWS:
                x = np.full((rows, 4), 0.5, dtype=np.float32)
                answer = await sdk.infer("ens", {"X": x})
                assert answer.as_numpy()["Y"].shape == (rows, 4)
            bad = await sdk.infer("ens", {"X": np.ones((1, 3), np.float32)}, raise_on_error=False)
            assert bad.error is not None  # failed at the step: no execution
            got = await scrape(runner.metrics.port)
        finally:
            await runner.stop()  # its last statistics flush

    v1 = {"model": "ens", "version": "1"}
    assert value(got, "nv_inference_request_success", **v1) == len(ROWS)
    assert value(got, "nv_inference_count", **v1) == sum(ROWS)
    assert value(got, "nv_inference_exec_count", **v1) == len(ROWS)
    assert value(got, "plaza_inference_batch_size_count", **v1) == len(ROWS)
    assert value(got, "plaza_inference_batch_size_sum", **v1) == sum(ROWS)
    assert value(got, "plaza_inference_batch_size_bucket", le="1.0", **v1) == 4

    models = {"ens": SimpleNamespace(versions=(1,))}
    body = await read_statistics(redis_client, settings.names, models)  # type: ignore[arg-type]
    (stats,) = body["model_stats"]
    assert stats["inference_count"] == sum(ROWS)
    assert stats["execution_count"] == len(ROWS)
    assert stats["inference_stats"]["success"]["count"] == len(ROWS)
    assert stats["inference_stats"]["fail"]["count"] == 1
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
    assert sizes == {1: 4, 3: 1}
    # The durations of an execution are the request's own compute times (as Triton uses
    # the same ones for the request's inference_stats and the ensemble's batch_stats).
    batch_ns = sum(b["compute_infer"]["ns"] for b in stats["batch_stats"])
    assert batch_ns == stats["inference_stats"]["compute_infer"]["ns"] > 0
