"""A step beside a decoupled ensemble's decoupled step fails: the request fails with that
step's error at once, whether or not the decoupled step has answered, and the decoupled
step's request is cancelled. On the real Kafka and Redis.

The ensemble ``guarded``: ``refuse`` (answers every request with an error) and ``repeat``
(the decoupled test model) both read the request's input. No worker serves ``repeat``: it
never answers, so the request can end only by ``refuse``'s error (or, were that error
seen only at ``repeat``'s first response, by the request's deadline, far beyond the test's
bound).
"""

from __future__ import annotations

from contextlib import AsyncExitStack, aclosing
from pathlib import Path

import numpy as np
import redis.asyncio as aioredis

from plaza.client import PlazaClient
from plaza.codec import decode_result
from plaza.contract import InferResult
from plaza.naming import step_request_id
from plaza.workers.ensemble import EnsembleRunner
from tests.python_models import write_model, write_repository
from tests.support import make_settings, phase, running_worker, wait_for, with_model

REFUSE_CONFIG = """
name: "refuse"
backend: "python"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "TOTAL" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
REFUSE_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Refuses every request (INVALID_ARG)."""

    def execute(self, requests):
        code = pb_utils.TritonError.INVALID_ARG
        error = pb_utils.TritonError("IN is refused", code)
        return [pb_utils.InferenceResponse(output_tensors=[], error=error) for _ in requests]
'''
GUARDED_CONFIG = """
name: "guarded"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [
  { name: "TOKEN" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "TOTAL" data_type: TYPE_INT32 dims: [ 1 ] }
]
model_transaction_policy { decoupled: true }
ensemble_scheduling {
  step [
    {
      model_name: "refuse"
      model_version: -1
      input_map { key: "IN" value: "IN" }
      output_map { key: "TOTAL" value: "TOTAL" }
    },
    {
      model_name: "repeat"
      model_version: -1
      input_map { key: "IN" value: "IN" }
      output_map { key: "OUT" value: "TOKEN" }
    }
  ]
}
"""
DEADLINE_S = 600.0
"""The request's deadline: without the fix, the runner waited for ``repeat`` until then."""
BOUND_S = 60.0
"""The test's own bound, far below it."""


async def test_a_failed_step_beside_a_silent_decoupled_step_fails_the_request_at_once(
    kafka_bootstrap: str,
    redis_url: str,
    unique_id: str,
    tmp_path: Path,
    redis_client: aioredis.Redis,
) -> None:
    root = write_repository(tmp_path / "repository", "repeat")
    write_model(root, "refuse", REFUSE_CONFIG, REFUSE_MODEL)
    write_model(root, "guarded", GUARDED_CONFIG, "")
    settings = make_settings(kafka_bootstrap, redis_url, unique_id, repository=root)
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(running_worker(settings, "refuse"))  # repeat: none
        runner = EnsembleRunner(with_model(settings, "guarded"))
        await runner.start()
        stack.push_async_callback(runner.stop)
        client = await stack.enter_async_context(PlazaClient(settings))
        inputs = {"IN": np.array([[1, 2, 3]], np.int32)}
        results: list[InferResult] = []
        async with phase("the ensemble's answer", BOUND_S):
            stream = client.infer_stream(
                "guarded",
                inputs,
                correlation_id="guarded-1",
                timeout_s=DEADLINE_S,
                raise_on_error=False,
            )
            async with aclosing(stream) as responses:
                results = [r async for r in responses]
        await wait_for(lambda: runner.in_flight == 0, 30, "the runner let it go")
        raw = await redis_client.get(settings.names.result_key(step_request_id("guarded-1", 1)))
    assert len(results) == 1
    failed = results[0]
    assert failed.final and failed.index == 0 and failed.error is not None
    assert failed.error.code == "invalid_input"
    assert failed.error.message == "step 0 (model 'refuse'): IN is refused"
    assert raw is not None, "the decoupled step's request was not cancelled"
    step_answer = decode_result(raw)
    assert step_answer.error is not None and step_answer.error.code == "cancelled"
