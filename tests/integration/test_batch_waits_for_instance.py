"""A batch forms only once an instance is free to run it, on real Kafka and Redis.

As Triton's dynamic batcher: while every instance of the model is busy, requests stay in the
queue, where their queue-policy timeouts still apply and later requests join them. A batch
formed earlier would wait frozen for the instance: a request timing out meanwhile would still
run, and requests arriving meanwhile would make a batch of their own.

The model's only instance is held busy by a gate in its backend that the test opens.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from plaza.client import PlazaClient, make_request
from plaza.settings import PlazaSettings
from tests.support import gated, model_variant, running_worker, wait_for

IDENTITY = """
name: "{name}" platform: "onnxruntime_onnx" max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
dynamic_batching {{ max_queue_delay_microseconds: 0 {batching} }}
"""


def variant(
    tmp_path: Path, settings: PlazaSettings, name: str, batching: str = ""
) -> PlazaSettings:
    repo = model_variant(tmp_path, name, IDENTITY.format(name=name, batching=batching))
    return settings.model_copy(update={"repository": repo})


def x(i: float) -> dict[str, np.ndarray]:
    return {"INPUT0": np.full((1, 2), i, np.float32)}


async def test_requests_arriving_while_the_instance_is_busy_run_as_one_batch(
    tmp_path: Path, settings: PlazaSettings
) -> None:
    s = variant(tmp_path, settings, "joining")
    async with PlazaClient(s) as client, running_worker(s, "joining") as worker:
        gate = gated(worker)
        first = await client.submit("joining", x(0))
        await wait_for(gate.entered.is_set, 30, "the first batch to run")
        # One arrives alone while the instance is busy, then seven more.
        jobs = [await client.submit("joining", x(1))]
        await wait_for(lambda: worker._pending() == 2, 30, "the second request taken in")
        jobs += [await client.submit("joining", x(i)) for i in range(2, 9)]
        await wait_for(lambda: worker._pending() == 9, 30, "all nine taken in")
        gate.gate.set()
        results = [await client.result(job, timeout_s=60) for job in [first, *jobs]]
        assert [r.error for r in results] == [None] * 9
        # The eight waited together for the instance: one batch of 8, not 1 and then 7.
        assert worker.metrics.batch_sizes() == {1: 1, 8: 1}


async def test_a_request_whose_queue_timeout_passes_while_the_instance_is_busy_never_runs(
    tmp_path: Path, settings: PlazaSettings
) -> None:
    policy = (
        "default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 60000000 "
        "allow_timeout_override: true }"
    )
    s = variant(tmp_path, settings, "expiring", policy)
    async with PlazaClient(s) as client, running_worker(s, "expiring") as worker:
        gate = gated(worker)
        first = await client.submit("expiring", x(0))
        await wait_for(gate.entered.is_set, 30, "the first batch to run")
        late = make_request("expiring", x(1), timeout_s=0.5)
        await client.publish_many([late])
        await wait_for(lambda: worker._pending() == 2, 30, "the late request taken in")
        deadline_ms = late.deadline_ms
        assert deadline_ms is not None
        # The instance is still busy when the late request's timeout passes.
        await wait_for(lambda: time.time() * 1000 > deadline_ms + 20, 30, "its deadline")
        gate.gate.set()
        assert (await client.result(first, timeout_s=60)).error is None
        answer = await client.result(late.id, timeout_s=60, raise_on_error=False)
        assert answer.error is not None and answer.error.code == "timeout"
        assert worker.metrics.records["expired"] == 1
        assert worker.metrics.batch_sizes() == {1: 1}  # the late request never ran
