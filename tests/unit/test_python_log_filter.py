"""A Python model's process drops WARNING and ERROR records as its worker does (the
worker's ``log_warnings`` and ``log_errors``: ``SeverityFilter``), at its start and after a
change at run time, from its next batch on (workers/backends/python_backend.py and
python_stub.py). Real child processes, no Kafka."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from plaza.client import make_request
from plaza.log_settings import LogSettings, PlazaFormatter, SeverityFilter, apply
from plaza.repository import ModelRepository
from plaza.workers.backends.python_backend import PythonBackend, worker_log
from plaza.workers.backends.python_stub import _configure_logging, _follow_log
from plaza.workers.device import CPU
from tests.python_models import write_model

CONFIG = """
name: "talker"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

MODEL = '''
import logging

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Logs at each severity (through pb_utils.Logger and its own logger), echoes X."""

    def execute(self, requests):
        pb_utils.Logger.log_info("talker-info")
        pb_utils.Logger.log_warn("talker-warn")
        pb_utils.Logger.log_error("talker-error")
        logging.getLogger("talker").warning("talker-own-warning")
        echo = [pb_utils.Tensor("Y", r.inputs()[0].as_numpy()) for r in requests]
        return [pb_utils.InferenceResponse([y]) for y in echo]
'''


@pytest.fixture
def worker_root() -> Iterator[logging.Logger]:
    """The root logger with a handler as ``configure_logging`` installs (the one
    ``apply`` filters), taken away again after the test with the root's level."""
    root = logging.getLogger()
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(PlazaFormatter())
    level = root.level
    root.addHandler(handler)
    yield root
    root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture
def talker(tmp_path: Path) -> Iterator[PythonBackend]:
    root = write_model(tmp_path, "talker", CONFIG, MODEL)
    backend = PythonBackend(ModelRepository(root).served_versions("talker")[0], CPU)
    yield backend
    backend.unload()


def _talk(backend: PythonBackend) -> None:
    (answer,) = backend.execute_requests([make_request("talker", {"X": np.array([1], np.int32)})])
    assert isinstance(answer, tuple), answer


def test_worker_log_says_which_severities_the_worker_drops(worker_root: logging.Logger) -> None:
    assert worker_log(worker_root)[2:] == [True, True]  # no filter yet: everything passes
    apply(LogSettings(log_warnings=False), worker_root)
    assert worker_log(worker_root) == [logging.INFO, "default", False, True]
    apply(LogSettings(log_errors=False, log_format="ISO8601"), worker_root)
    assert worker_log(worker_root) == [logging.INFO, "ISO8601", True, False]


def test_the_model_process_follows_the_frame_s_severities(worker_root: logging.Logger) -> None:
    """What the stub does with a frame's ``log``, here on this process's root logger."""
    handler = next(h for h in worker_root.handlers if isinstance(h.formatter, PlazaFormatter))
    _follow_log([logging.INFO, "default", False, True])
    (severity,) = [f for f in handler.filters if isinstance(f, SeverityFilter)]
    assert (severity.warnings, severity.errors) == (False, True)
    _follow_log([logging.INFO, "default", True, False])
    assert [f for f in handler.filters if isinstance(f, SeverityFilter)] == [severity]
    assert (severity.warnings, severity.errors) == (True, False)
    _follow_log([logging.INFO, "default"])  # a frame without them leaves them as they are
    assert (severity.warnings, severity.errors) == (True, False)


def test_the_model_process_starts_with_the_severities_of_its_arguments(
    worker_root: logging.Logger,
) -> None:
    """Its command line (``READ_FD WRITE_FD PARENT_PID LOG_LEVEL WARNINGS ERRORS``), as
    ``PythonBackend`` starts it; here on this process's root logger."""
    handler = next(h for h in worker_root.handlers if isinstance(h.formatter, PlazaFormatter))
    _configure_logging(["stub", "3", "4", "5", str(logging.INFO), "0", "1"])
    (severity,) = [f for f in handler.filters if isinstance(f, SeverityFilter)]
    assert (severity.warnings, severity.errors) == (False, True)
    assert worker_root.level == logging.INFO


def test_a_python_model_drops_the_severities_its_worker_drops(
    worker_root: logging.Logger, talker: PythonBackend, capfd: pytest.CaptureFixture[str]
) -> None:
    apply(LogSettings(log_warnings=False), worker_root)  # log_warnings=false, at INFO
    talker.load()
    _talk(talker)
    err = capfd.readouterr().err  # the model's process writes to the worker's stderr
    assert "talker-info" in err and "talker-error" in err, err
    assert "talker-warn" not in err and "talker-own-warning" not in err, err

    apply(LogSettings(log_errors=False), worker_root)  # changed at run time
    _talk(talker)
    err = capfd.readouterr().err
    assert "talker-warn" in err and "talker-own-warning" in err, err
    assert "talker-info" in err and "talker-error" not in err, err
