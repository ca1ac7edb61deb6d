"""Fault: kill -9 the worker of a decoupled model in the middle of a request's responses.

``trickle`` (below) answers each element of its input as a response of its own. On its
first run it stops after a few responses of the batch's first request and hangs, so the
worker is killed with that request half answered and its batch-mates not answered at all. A second
worker replays the uncommitted records: the half-answered request runs again in full, and
the writer's first-write-wins per response keeps the responses already out, so the reader
of the result stream sees every response of every request exactly once, in order, the
first ones from the dead worker and the rest from the survivor (``workers/writer.py``,
docs/models.md "Decoupled models").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from plaza.client import PlazaClient, make_request
from plaza.contract import InferResult
from plaza.stack import Deployment, wait_assignment
from tests.faults.processes import FaultProcesses
from tests.python_models import write_model
from tests.support import short_session, wait_for

REQUESTS, LENGTH, HALT_AFTER = 4, 6, 3
"""Requests in the batch, responses each before its final one, and how many of the first
request's responses go out before the first run hangs."""

CONFIG = """
name: "trickle"
backend: "python"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
dynamic_batching { max_queue_delay_microseconds: 500000 }
"""

MODEL = """
import os
import time

import numpy as np

import triton_python_backend_utils as pb_utils

HALT_AFTER = {halt_after}


class TritonPythonModel:
    \"\"\"One response per element of IN. The first run anywhere (no marker file in the
    model's folder yet) writes the marker after HALT_AFTER responses and hangs.\"\"\"

    def initialize(self, args):
        self.marker = os.path.join(args["model_repository"], "halted")

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)
            for i, value in enumerate(values.tolist()):
                if i == HALT_AFTER and not os.path.exists(self.marker):
                    open(self.marker, "w").close()
                    time.sleep(3600)
                out = pb_utils.Tensor("OUT", np.array([[value]], np.int32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
""".replace("{halt_after}", str(HALT_AFTER))


@pytest.mark.timeout(180)
async def test_a_decoupled_request_half_answered_by_a_killed_worker_is_answered_once(
    deployments: Callable[..., Deployment], processes: FaultProcesses, tmp_path: Path
) -> None:
    repository = write_model(tmp_path / "repository", "trickle", CONFIG, MODEL)
    marker = repository / "trickle" / "halted"
    deployment = short_session(deployments(repository=repository))
    victim = processes.worker(deployment, "a", model="trickle")
    await victim.wait_registered()
    await wait_assignment([victim], deployment.partitions)
    seen: dict[str, list[InferResult]] = {}
    async with PlazaClient(deployment.settings()) as client:
        stream = client.results_stream("trickle")
        requests = [
            make_request(
                "trickle",
                {"IN": np.arange(10 * k, 10 * k + LENGTH, dtype=np.int32).reshape(1, LENGTH)},
                reply_stream=stream,
            )
            for k in range(REQUESTS)
        ]
        ids = await client.publish_many(requests)
        seen = {rid: [] for rid in ids}
        reader = client.consume(stream, "g", "c1", block_ms=500)

        async def read_some() -> None:
            _, results = await anext(reader)
            for result in results:
                seen[result.id].append(result)

        while sum(len(v) for v in seen.values()) < HALT_AFTER:  # the first run's responses
            await read_some()
        await wait_for(marker.exists, 30, "the first run to halt")
        victim.kill()
        killed_at = time.monotonic()
        survivor = processes.worker(deployment, "b", model="trickle")
        while not all(v and v[-1].final for v in seen.values()):
            await read_some()
        recovered_s = time.monotonic() - killed_at
        await reader.aclose()
    print(
        f"FAULT decoupled_worker_kill: requests={REQUESTS} responses={LENGTH} "
        f"out_before_kill={HALT_AFTER} recover_s={recovered_s:.1f}"
    )
    # the batch's first request (whichever its fetch put first) is the half-answered one
    half = [rid for rid in ids if seen[rid][0].worker == victim.worker_id]
    assert len(half) == 1
    for k, rid in enumerate(ids):
        results = seen[rid]
        assert [r.index for r in results] == list(range(LENGTH + 1))  # each once, in order
        assert [int(r.as_numpy()["OUT"][0, 0]) for r in results[:LENGTH]] == [
            10 * k + i for i in range(LENGTH)
        ]
        assert results[-1].final and results[-1].empty
        out_before = HALT_AFTER if rid in half else 0
        assert [r.worker for r in results[:out_before]] == [victim.worker_id] * out_before
        assert {r.worker for r in results[out_before:LENGTH]} == {survivor.worker_id}
