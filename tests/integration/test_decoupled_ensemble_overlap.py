"""A decoupled ensemble's decoupled step starts as soon as its own inputs exist, while the
steps beside it still run; their outputs still reach every response. On the real Kafka and
Redis.

The ensemble ``overlap``: ``marked`` (decoupled: marks that it started, then one response
per element of IN) and ``beside`` (reads IN as well, and answers only once it sees that
mark) both read the request's input; ``post`` copies each response's token. Had the
ensemble waited for ``beside`` before starting ``marked``, ``beside`` would wait for a mark
that never comes, and the request would fail; a ``beside`` that fails fails the request.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import numpy as np

from plaza.client import PlazaClient
from plaza.settings import PlazaSettings
from plaza.workers.ensemble import EnsembleRunner
from tests.python_models import write_model
from tests.support import make_settings, running_worker, with_model

MARKED_CONFIG = """
name: "marked"
backend: "python"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
parameters { key: "mark" value: { string_value: "MARK" } }
"""
MARKED_MODEL = '''
import json

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Writes its mark file when it starts a request, then one response per element."""

    def initialize(self, args):
        self.mark = json.loads(args["model_config"])["parameters"]["mark"]["string_value"]

    def execute(self, requests):
        for request in requests:
            with open(self.mark, "w") as f:
                f.write("started")
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)
            for value in values.tolist():
                out = pb_utils.Tensor("OUT", np.array([[value]], np.int32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''
BESIDE_CONFIG = """
name: "beside"
backend: "python"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "TOTAL" data_type: TYPE_INT32 dims: [ 1 ] } ]
parameters { key: "mark" value: { string_value: "MARK" } }
"""
BESIDE_MODEL = '''
import json
import os
import time

import numpy as np

import triton_python_backend_utils as pb_utils

WAIT_S = 10.0


class TritonPythonModel:
    """TOTAL = the sum of IN, answered once the mark file exists (an error after WAIT_S);
    a negative element is an error at once."""

    def initialize(self, args):
        self.mark = json.loads(args["model_config"])["parameters"]["mark"]["string_value"]

    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if (values < 0).any():
                error = pb_utils.TritonError("a negative element")
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            give_up = time.monotonic() + WAIT_S
            while not os.path.exists(self.mark) and time.monotonic() < give_up:
                time.sleep(0.01)
            if not os.path.exists(self.mark):
                error = pb_utils.TritonError("the decoupled step has not started")
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            total = values.sum(axis=1, keepdims=True).astype(np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("TOTAL", total)]))
        return responses
'''
POST_CONFIG = """
name: "post"
backend: "plaza_simulated"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""
OVERLAP_CONFIG = """
name: "overlap"
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
      model_name: "beside"
      model_version: -1
      input_map { key: "IN" value: "IN" }
      output_map { key: "TOTAL" value: "TOTAL" }
    },
    {
      model_name: "marked"
      model_version: -1
      input_map { key: "IN" value: "IN" }
      output_map { key: "OUT" value: "raw" }
    },
    {
      model_name: "post"
      model_version: -1
      input_map { key: "INPUT0" value: "raw" }
      output_map { key: "OUTPUT0" value: "TOKEN" }
    }
  ]
}
"""


async def test_the_decoupled_step_runs_beside_the_steps_it_does_not_wait_for(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path
) -> None:
    root = tmp_path / "repository"
    mark = str(tmp_path / "marked-started")
    for name, config, source in (
        ("marked", MARKED_CONFIG, MARKED_MODEL),
        ("beside", BESIDE_CONFIG, BESIDE_MODEL),
        ("post", POST_CONFIG, ""),
        ("overlap", OVERLAP_CONFIG, ""),
    ):
        write_model(root, name, config.replace("MARK", mark), source)
    settings: PlazaSettings = make_settings(kafka_bootstrap, redis_url, unique_id, repository=root)
    async with AsyncExitStack() as stack:
        for model in ("marked", "beside", "post"):
            await stack.enter_async_context(running_worker(settings, model))
        runner = EnsembleRunner(with_model(settings, "overlap"))
        await runner.start()
        stack.push_async_callback(runner.stop)
        client = await stack.enter_async_context(PlazaClient(settings))

        async def stream(values: list[int]) -> list[tuple[int, int] | str]:
            inputs = {"IN": np.array([values], np.int32)}
            out: list[tuple[int, int] | str] = []
            async for r in client.infer_stream(
                "overlap", inputs, raise_on_error=False, timeout_s=60
            ):
                if r.error is not None:
                    out.append(r.error.message)
                    continue
                arrays = r.as_numpy()
                token, total = arrays["TOKEN"].reshape(-1)[0], arrays["TOTAL"].reshape(-1)[0]
                out.append((int(token), int(total)))
            return out

        # beside answers only once marked has started: both ran at once
        assert await stream([3, 4, 5]) == [(3, 12), (4, 12), (5, 12)]
        # a step beside the decoupled one that fails fails the request
        failed = await stream([-1, 2])
        assert failed == ["step 0 (model 'beside'): a negative element"]
