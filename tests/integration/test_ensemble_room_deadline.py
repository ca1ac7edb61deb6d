"""A request waiting for a step's place (``max_inflight_requests``) keeps its deadline and
notices a caller who left, on the real Kafka and Redis.

The decoupled ensemble ``dripper`` (``drip``, a decoupled model that answers every 0.2 s
until its request is cancelled, then ``post``) lets one request at a time into ``drip``. One
long stream holds that place; behind it, a request with a 1.5 s deadline gets its timeout
once the deadline (plus the runner's grace) has passed, and a request whose caller leaves
is let go, both while the long stream goes on.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack, aclosing
from pathlib import Path

import numpy as np

from plaza.client import PlazaClient, make_request
from plaza.contract import InferResult
from plaza.errors import DeadlineExceeded
from plaza.settings import PlazaSettings
from plaza.workers.ensemble import EnsembleRunner
from tests.python_models import write_model
from tests.support import make_settings, running_worker, wait_for, with_model

DRIP_CONFIG = """
name: "drip"
backend: "python"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
"""
DRIP_MODEL = '''
import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """A response every 0.2 s (OUT = how many so far) until the request is cancelled."""

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            sent = 0
            while sent < 10000 and not request.is_cancelled():
                out = pb_utils.Tensor("OUT", np.array([[sent]], np.int32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
                sent += 1
                time.sleep(0.2)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''
POST = """
name: "post"
backend: "plaza_simulated"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
DRIPPER = """
name: "dripper"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
ensemble_scheduling {
  max_inflight_requests: 1
  step [
    {
      model_name: "drip"
      model_version: -1
      input_map { key: "IN" value: "IN" }
      output_map { key: "OUT" value: "t" }
    },
    {
      model_name: "post"
      model_version: -1
      input_map { key: "INPUT0" value: "t" }
      output_map { key: "OUTPUT0" value: "Y" }
    }
  ]
}
"""


def _settings(kafka_bootstrap: str, redis_url: str, unique_id: str, root: Path) -> PlazaSettings:
    write_model(root, "drip", DRIP_CONFIG, DRIP_MODEL)
    for name, config in (("post", POST), ("dripper", DRIPPER)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
    return make_settings(kafka_bootstrap, redis_url, unique_id, repository=root)


async def _read(
    runner: EnsembleRunner,
    client: PlazaClient,
    rid: str,
    got: list[InferResult],
    deadline_s: float | None = None,
) -> None:
    """Read request ``rid``'s responses into ``got`` until its final one."""
    inputs = {"IN": np.array([[0]], np.int32)}
    req = make_request("dripper", inputs, correlation_id=rid, timeout_s=deadline_s)
    async with aclosing(client.producer.infer_stream(req, runner.spec, 60)) as responses:
        async for result in responses:
            got.append(result)


async def test_a_request_waiting_for_a_place_keeps_its_deadline_and_its_caller(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path, redis_client: object
) -> None:
    settings = _settings(kafka_bootstrap, redis_url, unique_id, tmp_path / "repository")
    async with AsyncExitStack() as stack:
        for model in ("drip", "post"):
            await stack.enter_async_context(running_worker(settings, model))
        runner = EnsembleRunner(with_model(settings, "dripper"))
        await runner.start()
        stack.push_async_callback(runner.stop)
        client = await stack.enter_async_context(PlazaClient(settings))
        long: list[InferResult] = []
        late: list[InferResult] = []
        leaving: list[InferResult] = []
        reading = asyncio.create_task(_read(runner, client, "long", long))
        try:
            await wait_for(lambda: len(long) > 0, 30, "the long stream holds the place")
            timed = asyncio.create_task(_read(runner, client, "late", late, deadline_s=1.5))
            left = asyncio.create_task(_read(runner, client, "leaving", leaving))
            await wait_for(lambda: runner.in_flight == 3, 30, "both waiting for the place")
            left.cancel()  # its caller leaves: a cancelled answer is stored for it
            # 1.5 s deadline + the runner's 5 s grace; the long stream never ends by itself
            await wait_for(timed.done, 15, "the late request answered")
            await wait_for(lambda: runner.in_flight == 1, 10, "the departed caller's let go")
            assert not reading.done()
        finally:
            reading.cancel()
        await wait_for(lambda: runner.in_flight == 0, 30, "the long stream cancelled")
    await timed  # ended without raising
    assert leaving == []
    final = late[-1]
    assert final.final and final.error is not None
    assert final.error.code == DeadlineExceeded.code
    assert "max_inflight_requests" in final.error.message
