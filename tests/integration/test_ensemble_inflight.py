"""Triton's ``ensemble_scheduling { max_inflight_requests }`` on the real Kafka and Redis: at
most that many step requests are in flight at each step, over all the ensemble's requests.

Two ensembles of one step each, over two copies of a slow simulated model that batches
whatever its queue holds: twelve requests at once to the unlimited ensemble reach its
step's worker together and share batches; the same twelve to the one limited to one
request in flight reach it one at a time, so each of its batches holds one request.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from plaza.client import PlazaClient
from plaza.settings import PlazaSettings
from plaza.workers.ensemble import EnsembleRunner
from tests.support import make_settings, running_worker, with_model

SLOW = """
name: "NAME"
backend: "plaza_simulated"
max_batch_size: 16
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
parameters { key: "latency_b_us" value: { string_value: "20000" } }
dynamic_batching { max_queue_delay_microseconds: 50000 }
"""
ENSEMBLE = """
name: "NAME"
platform: "ensemble"
max_batch_size: 16
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling {
  LIMIT
  step [
    {
      model_name: "STEP"
      model_version: -1
      input_map { key: "INPUT0" value: "X" }
      output_map { key: "OUTPUT0" value: "Y" }
    }
  ]
}
"""


def _repository(root: Path) -> Path:
    models = {
        "slow_a": SLOW.replace("NAME", "slow_a"),
        "slow_b": SLOW.replace("NAME", "slow_b"),
        "free": ENSEMBLE.replace("NAME", "free").replace("STEP", "slow_a").replace("LIMIT", ""),
        "one_at_a_time": ENSEMBLE.replace("NAME", "one_at_a_time")
        .replace("STEP", "slow_b")
        .replace("LIMIT", "max_inflight_requests: 1"),
    }
    for name, config in models.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
    return root


async def test_max_inflight_requests_bounds_each_steps_requests_in_flight(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path, redis_client: object
) -> None:
    settings: PlazaSettings = make_settings(
        kafka_bootstrap, redis_url, unique_id, repository=_repository(tmp_path / "repository")
    )
    runners = [EnsembleRunner(with_model(settings, m)) for m in ("free", "one_at_a_time")]
    assert [r.spec.max_inflight_requests for r in runners] == [0, 1]
    async with (
        running_worker(settings, "slow_a") as slow_a,
        running_worker(settings, "slow_b") as slow_b,
    ):
        for runner in runners:
            await runner.start()
        try:
            async with PlazaClient(settings) as client:
                for model in ("free", "one_at_a_time"):
                    xs = [np.array([[k]], np.int32) for k in range(12)]
                    answers = await asyncio.gather(
                        *(client.infer(model, {"X": x}, timeout_s=60) for x in xs)
                    )
                    ys = [int(a.as_numpy()["Y"][0, 0]) for a in answers]
                    assert ys == list(range(12))
        finally:
            for runner in runners:
                await runner.stop()
        free, limited = slow_a.metrics.batch_sizes(), slow_b.metrics.batch_sizes()
    assert sum(size * n for size, n in free.items()) == 12
    assert max(free) > 1  # unlimited: the requests met in the step's queue
    assert limited == {1: 12}  # one in flight at a time: a batch of one, twelve times
