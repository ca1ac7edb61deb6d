"""BLS as Triton's documentation writes it, through real workers on real Kafka and Redis.

A caller model calls other models by their Kafka topics: a stateful one with Triton's
``correlation_id`` and sequence flags (README, "Using BLS with Stateful Models"); one that
answers errors of each Triton code, which the caller reads back unchanged; and the decoupled
``endless``, whose stream the caller cancels (``ResponseIterator.cancel()``), which stops it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from plaza.client import PlazaClient
from plaza.settings import PlazaSettings
from plaza.workers.backends import pb_utils
from tests.python_models import write_model, write_repository
from tests.support import make_settings, running_worker, set_bls_environment, wait_for

SEQUENCE_CONFIG = """
name: "api_sequence"
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [
  { name: "FLAGS" data_type: TYPE_INT64 dims: [ 1 ] },
  { name: "CORR" data_type: TYPE_INT64 dims: [ 1 ] }
]
sequence_batching { max_sequence_idle_microseconds: 5000000 }
"""

SEQUENCE_MODEL = '''
import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """A stateful model that answers each request's flags() and correlation_id()."""

    def execute(self, requests):
        responses = []
        for request in requests:
            flags = pb_utils.Tensor("FLAGS", np.array([[request.flags()]], np.int64))
            corr = pb_utils.Tensor("CORR", np.array([[request.correlation_id()]], np.int64))
            responses.append(pb_utils.InferenceResponse([flags, corr]))
        return responses
'''

CODED_CONFIG = """
name: "api_coded"
backend: "python"
max_batch_size: 0
input [ { name: "CODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

CODED_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Answers a TritonError whose code is its CODE."""

    def execute(self, requests):
        responses = []
        for request in requests:
            code = int(request.inputs()[0].as_numpy()[0])
            error = pb_utils.TritonError(f"coded {code}", code)
            responses.append(pb_utils.InferenceResponse(error=error))
        return responses
'''

CALLER_CONFIG = """
name: "api_caller"
backend: "python"
max_batch_size: 0
input [ { name: "WHAT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "REPORT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

CALLER_MODEL = '''
import json

import numpy as np

import triton_python_backend_utils as pb_utils

TIMEOUT_US = 60_000_000
CODES = [
    pb_utils.TritonError.NOT_FOUND,
    pb_utils.TritonError.ALREADY_EXISTS,
    pb_utils.TritonError.UNKNOWN,
    pb_utils.TritonError.UNSUPPORTED,
    pb_utils.TritonError.INTERNAL,
]


class TritonPythonModel:
    """WHAT names the BLS call to make; REPORT is what came back, as JSON."""

    def execute(self, requests):
        responses = []
        for request in requests:
            what = request.inputs()[0].as_numpy()[0].decode()
            report = json.dumps(getattr(self, what)()).encode()
            out = pb_utils.Tensor("REPORT", np.array([report], np.object_))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses

    def sequence(self):
        flags = (
            pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
            | pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
        )
        call = pb_utils.InferenceRequest(
            model_name="api_sequence",
            requested_output_names=["FLAGS", "CORR"],
            inputs=[pb_utils.Tensor("X", np.array([[1]], np.int64))],
            correlation_id=77,
            flags=flags,
            timeout=TIMEOUT_US,
        )
        response = call.exec()
        if response.has_error():
            return {"error": response.error().message()}
        return {t.name(): int(t.as_numpy()[0, 0]) for t in response.output_tensors()}

    def codes(self):
        got = []
        for code in CODES:
            call = pb_utils.InferenceRequest(
                model_name="api_coded",
                requested_output_names=["OUT"],
                inputs=[pb_utils.Tensor("CODE", np.array([code], np.int32))],
                timeout=TIMEOUT_US,
            )
            got.append(call.exec().error().code())
        return got

    def cancel(self):
        call = pb_utils.InferenceRequest(
            model_name="endless",
            requested_output_names=["OUT"],
            inputs=[pb_utils.Tensor("IN", np.array([[0]], np.int32))],
            timeout=TIMEOUT_US,
        )
        responses = call.exec(decoupled=True)
        taken = [next(responses) for _ in range(3)]
        responses.cancel()
        return {"taken": len(taken), "after_cancel": len(list(responses))}
'''


@pytest.fixture
def settings(
    kafka_bootstrap: str,
    redis_url: str,
    unique_id: str,
    tmp_path: Path,
    redis_client: object,
    monkeypatch: pytest.MonkeyPatch,
) -> PlazaSettings:
    """This test's prefixes, serving these models and ``endless`` from tmp_path, in the
    PLAZA_* environment that a worker's model process reads for its BLS calls."""
    root = write_repository(tmp_path / "repository", "endless")
    for name, config, source in (
        ("api_sequence", SEQUENCE_CONFIG, SEQUENCE_MODEL),
        ("api_coded", CODED_CONFIG, CODED_MODEL),
        ("api_caller", CALLER_CONFIG, CALLER_MODEL),
    ):
        write_model(root, name, config, source)
    settings = make_settings(kafka_bootstrap, redis_url, unique_id, repository=root)
    set_bls_environment(settings, monkeypatch)
    return settings


async def _report(client: PlazaClient, what: str) -> object:
    inputs = {"WHAT": np.array([what.encode()], np.object_)}
    result = await client.infer("api_caller", inputs, timeout_s=90)
    return json.loads(result.output("REPORT").to_numpy()[0])


async def test_bls_reaches_a_stateful_model_with_its_correlation_id_and_flags(
    settings: PlazaSettings,
) -> None:
    async with (
        running_worker(settings, "api_caller"),
        running_worker(settings, "api_sequence"),
        PlazaClient(settings) as client,
    ):
        report = await _report(client, "sequence")
    assert report == {"FLAGS": 3, "CORR": 77}  # START | END, and the sequence's id


async def test_a_bls_caller_reads_the_called_models_error_code(settings: PlazaSettings) -> None:
    async with (
        running_worker(settings, "api_caller"),
        running_worker(settings, "api_coded"),
        PlazaClient(settings) as client,
    ):
        report = await _report(client, "codes")
    error = pb_utils.TritonError
    codes = [error.NOT_FOUND, error.ALREADY_EXISTS, error.UNKNOWN, error.UNSUPPORTED]
    assert report == [*codes, error.INTERNAL]


async def test_cancelling_a_bls_stream_stops_the_called_decoupled_model(
    settings: PlazaSettings,
) -> None:
    folder = settings.repository / "endless"
    async with (
        running_worker(settings, "api_caller"),
        running_worker(settings, "endless"),
        PlazaClient(settings) as client,
    ):
        report = await _report(client, "cancel")
        assert report == {"taken": 3, "after_cancel": 0}
        # endless saw is_cancelled() and wrote how many it had sent (at most 500 unasked).
        await wait_for(lambda: any(folder.glob("cancelled-*")), 30, "endless to be cancelled")
    (mark,) = folder.glob("cancelled-*")
    assert 3 <= int(mark.read_text()) < 500
