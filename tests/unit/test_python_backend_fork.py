"""A Python model's process that dies is noticed while a process it forked lives on (and
holds the pipes open, so their close never comes): its batch gets ``model_error`` and the
next batch a fresh process, with no ``execute_timeout_s`` set."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from plaza.client import make_request
from plaza.errors import ModelExecutionError
from plaza.repository import ModelRepository
from plaza.workers.backends import create_backend
from plaza.workers.backends.base import Answer
from plaza.workers.backends.python_backend import PythonBackend
from plaza.workers.device import CPU
from tests.python_models import write_model

FORKY_CONFIG = """
name: "forky"
backend: "python"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""

FORKY_MODEL = """
import multiprocessing
import os
import time

import triton_python_backend_utils as pb_utils


def helper():
    time.sleep(600)  # far past the test's timeout: only the test's end kills it


class TritonPythonModel:
    \"\"\"Forks a long-lived helper (its pid appended to <repository>/helpers); OUT = IN;
    an IN with -1 makes the process exit.\"\"\"

    def initialize(self, args):
        child = multiprocessing.get_context("fork").Process(target=helper, daemon=True)
        child.start()
        with open(os.path.join(args["model_repository"], "helpers"), "a") as pids:
            pids.write(f"{child.pid}\\n")

    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if (values == -1).any():
                os._exit(3)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", values)]))
        return responses
"""


@pytest.fixture
def forky(tmp_path: Path) -> Iterator[PythonBackend]:
    """The backend; at the end every helper its processes forked is killed (first: a
    batch that hangs on their pipes then ends too), then the backend unloaded."""
    root = write_model(tmp_path, "forky", FORKY_CONFIG, FORKY_MODEL)
    backend = create_backend(ModelRepository(root).served_versions("forky")[0], CPU)
    assert isinstance(backend, PythonBackend)
    try:
        backend.load()
        yield backend
    finally:
        helpers = tmp_path / "forky" / "helpers"
        for pid in helpers.read_text().split() if helpers.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        backend.unload()


def _run(backend: PythonBackend, values: np.ndarray) -> Answer:
    """On this thread (a test past its timeout then fails, its teardown runs)."""
    return backend.execute_requests([make_request("forky", {"IN": values})])[0]


def _exited(answer: Answer, status: int) -> bool:
    return isinstance(answer, ModelExecutionError) and (
        f"exited (status {status}) before answering" in answer.message
    )


def _out(answer: Answer) -> np.ndarray:
    assert isinstance(answer, tuple), answer
    return answer[0].to_numpy()


@pytest.mark.timeout(60)
def test_a_process_that_dies_is_noticed_while_its_forked_helper_lives(
    forky: PythonBackend,
) -> None:
    assert _exited(_run(forky, np.array([[1, -1]], np.int32)), 3)
    # the next batch: a fresh process (with a helper of its own)
    assert _out(_run(forky, np.array([[4, 5]], np.int32))).tolist() == [[4, 5]]


@pytest.mark.timeout(60)
def test_a_batch_too_big_for_the_pipe_is_not_written_forever_to_a_dead_process(
    forky: PythonBackend,
) -> None:
    """Killed between batches: the next batch's frame fills the pipe that the helper holds
    open but never reads."""
    pid = forky.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    big = np.arange(1 << 20, dtype=np.int32)[None, :]  # 4 MiB: far more than a pipe holds
    assert _exited(_run(forky, big), -9)
    assert np.array_equal(_out(_run(forky, big)), big)
    assert forky.pid not in (None, pid)
