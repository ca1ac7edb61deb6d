"""What a Python model's process hands model.py beyond its tensors, and what it hands back:
a request's sequence flags and timeout, the model's log at the worker's level, a
``TritonError``'s code in the worker's answer, and a BLS request's correlation id and flags
as the parameters a sequence model reads. Real child processes, no Kafka."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from plaza.client import make_request
from plaza.errors import PlazaError
from plaza.repository import ModelRepository
from plaza.workers.backends import pb_utils
from plaza.workers.backends.python_backend import PythonBackend
from plaza.workers.backends.python_stub import BlsClient
from plaza.workers.device import CPU
from tests.python_models import write_model

PROBE_CONFIG = """
name: "probe"
backend: "python"
max_batch_size: 0
input [ { name: "CODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "SEEN" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

PROBE_MODEL = '''
import json

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Logs at each level; CODE < 0 answers what the request looked like (flags, timeout,
    correlation id) as JSON; any other CODE answers a TritonError of that code."""

    def execute(self, requests):
        logger = pb_utils.Logger
        logger.log_info("probe-info")
        logger.log_verbose("probe-verbose")
        logger.log("probe-log-warning", logger.WARNING)
        responses = []
        for request in requests:
            code = int(request.inputs()[0].as_numpy()[0])
            if code >= 0:
                error = pb_utils.TritonError(f"probe: code {code}", code)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            seen = {
                "flags": request.flags(),
                "timeout": request.timeout(),
                "correlation_id": request.correlation_id(),
            }
            out = pb_utils.Tensor("SEEN", np.array([json.dumps(seen).encode()], np.object_))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
'''


@pytest.fixture
def probe(tmp_path: Path) -> Iterator[PythonBackend]:
    """The probe model in its own process (started when the test first needs it)."""
    root = write_model(tmp_path, "probe", PROBE_CONFIG, PROBE_MODEL)
    mv = ModelRepository(root).served_versions("probe")[0]
    backend = PythonBackend(mv, CPU)
    yield backend
    backend.unload()


def _seen(backend: PythonBackend, **options: object) -> dict[str, object]:
    request = make_request("probe", {"CODE": np.array([-1], np.int32)}, **options)  # type: ignore[arg-type]
    (answer,) = backend.execute_requests([request])
    assert isinstance(answer, tuple), answer
    seen: dict[str, object] = json.loads(answer[0].to_numpy()[0])
    return seen


def test_execute_sees_a_requests_sequence_flags_and_timeout(probe: PythonBackend) -> None:
    probe.load()
    start = {"sequence_id": 41, "sequence_start": True}
    assert _seen(probe, parameters=start, timeout_s=2.5) == {
        "flags": pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
        "timeout": 2_500_000,  # microseconds, as Triton's
        "correlation_id": 41,
    }
    both = {"sequence_id": "s", "sequence_start": True, "sequence_end": True}
    assert _seen(probe, parameters=both)["flags"] == 3
    assert _seen(probe, parameters={"sequence_id": 41, "sequence_end": True})["flags"] == 2
    assert _seen(probe) == {"flags": 0, "timeout": 0, "correlation_id": 0}


@pytest.mark.parametrize(
    ("level", "shown", "hidden"),
    [
        (
            logging.WARNING,
            ["WARNING triton_python_backend_utils: probe-log-warning"],
            ["probe-info"],
        ),
        (
            logging.DEBUG,
            [
                "INFO triton_python_backend_utils: probe-info",
                "DEBUG triton_python_backend_utils: probe-verbose",  # Triton's VERBOSE
            ],
            [],
        ),
    ],
)
def test_the_model_logs_to_stderr_at_the_workers_level(
    probe: PythonBackend,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    level: int,
    shown: list[str],
    hidden: list[str],
) -> None:
    caplog.set_level(level)  # the worker's level when it starts the model's process
    probe.load()
    _seen(probe)
    err = capfd.readouterr().err  # the model's process writes to the worker's stderr
    assert all(line in err for line in shown), err
    assert not any(word in err for word in hidden), err


def test_a_models_triton_error_code_is_the_code_of_its_answer(probe: PythonBackend) -> None:
    probe.load()
    error = pb_utils.TritonError
    codes = [error.NOT_FOUND, error.ALREADY_EXISTS, error.UNKNOWN, error.UNSUPPORTED]
    codes += [error.INTERNAL, error.INVALID_ARG]
    requests = [make_request("probe", {"CODE": np.array([c], np.int32)}) for c in codes]
    answers = probe.execute_requests(requests)
    assert all(isinstance(a, PlazaError) for a in answers)
    got = [a.code for a in answers if isinstance(a, PlazaError)]
    assert got == [
        "model_error_not_found",
        "model_error_already_exists",
        "model_error_unknown",
        "model_error_unsupported",
        "model_error",
        "invalid_input",
    ]


def _bls_parameters(**request: object) -> object:
    bls_request = pb_utils.InferenceRequest(model_name="m", **request)  # type: ignore[arg-type]
    return BlsClient._options(bls_request)["parameters"]


def test_a_bls_requests_correlation_id_and_flags_become_sequence_parameters() -> None:
    flags = (
        pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
        | pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
    )
    assert _bls_parameters(correlation_id=77, flags=flags, parameters={"k": "v"}) == {
        "k": "v",
        "sequence_id": 77,
        "sequence_start": True,
        "sequence_end": True,
    }
    end = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
    assert _bls_parameters(correlation_id="s-1", flags=end) == {
        "sequence_id": "s-1",
        "sequence_end": True,
    }
    assert _bls_parameters(parameters={"k": 1}) == {"k": 1}  # outside a sequence: nothing
