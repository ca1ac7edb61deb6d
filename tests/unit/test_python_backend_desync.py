"""A decoupled Python model's response that the worker cannot pass on fails its request
alone: the rest of the batch's frames are still read, so the next batch never reads them as
its own (one caller never gets another caller's outputs)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from plaza.client import make_request
from plaza.contract import InferResult
from plaza.repository import ModelRepository
from plaza.workers.backends import create_backend
from plaza.workers.backends.python_backend import PythonBackend
from plaza.workers.device import CPU
from plaza.workers.runner import BatchRunner, WorkItem
from tests.python_models import write_model

SHAPED_CONFIG = """
name: "shaped"
backend: "python"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 2 ] reshape: { shape: [ 1, 2 ] } } ]
model_transaction_policy { decoupled: true }
"""

SHAPED_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    \"\"\"One response [[v, v]] per value v of IN; a negative v's is [v, v, v], which does not
    fit OUT's reshape.\"\"\"

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for v in pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1):
                out = np.full((1, 3) if v < 0 else (1, 1, 2), v, np.int32)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


@pytest.fixture
def shaped(tmp_path: Path) -> Iterator[PythonBackend]:
    root = write_model(tmp_path, "shaped", SHAPED_CONFIG, SHAPED_MODEL)
    backend = create_backend(ModelRepository(root).served_versions("shaped")[0], CPU)
    assert isinstance(backend, PythonBackend)
    backend.load()
    yield backend
    backend.unload()


def _batch(backend: PythonBackend, *values: list[int]) -> list[list[InferResult]]:
    """One batch of a request per list of values: each request's responses, final last."""
    items = [
        WorkItem(make_request("shaped", {"IN": np.array([v], np.int32)}), rows=1, version=1)
        for v in values
    ]
    sent: list[InferResult] = []
    runner = BatchRunner(backend.spec, {1: backend})
    finals = asyncio.run(runner.run(items, lambda _item, result: sent.append(result)))
    return [[r for r in [*sent, *finals] if r.id == it.request.id] for it in items]


def _values(responses: list[InferResult]) -> list[list[list[int]] | str]:
    return [
        r.as_numpy()["OUT"].tolist() if r.outputs else r.error.code if r.error else "empty"
        for r in responses
    ]


def test_a_response_send_cannot_pass_on_fails_its_request_and_later_batches_get_their_own(
    shaped: PythonBackend,
) -> None:
    pid = shaped.pid
    bad, mate = _batch(shaped, [-1, 100, 101], [5, 6])
    # the bad response closes its request with the error; its later responses are dropped
    assert _values(bad) == ["model_error"] and bad[0].final and bad[0].index == 0
    assert bad[0].error is not None and "cannot be reshaped" in bad[0].error.message
    # its batch-mate is answered in full
    assert _values(mate) == [[[5, 5]], [[6, 6]], "empty"] and [r.index for r in mate] == [0, 1, 2]
    # each later batch gets its own outputs, from the same process (nothing left unread)
    assert _values(_batch(shaped, [7])[0]) == [[[7, 7]], "empty"]
    eight, nine = _batch(shaped, [8], [9])
    assert _values(eight) == [[[8, 8]], "empty"] and _values(nine) == [[[9, 9]], "empty"]
    assert shaped.pid == pid


def test_a_send_that_fails_even_to_close_its_request_kills_the_process(
    shaped: PythonBackend,
) -> None:
    """The backstop: frames the batch could not read are never read by the next batch."""
    pid = shaped.pid

    def refuse(_i: int, _answer: object, _final: bool) -> None:
        raise RuntimeError("the worker stops: its response buffer is closed")

    request = make_request("shaped", {"IN": np.array([[1, 2, 3]], np.int32)})
    with pytest.raises(RuntimeError, match="response buffer is closed"):
        shaped.execute_decoupled([request], refuse)
    assert shaped.pid is None  # killed; the next batch starts a fresh one
    assert _values(_batch(shaped, [7])[0]) == [[[7, 7]], "empty"]
    assert shaped.pid not in (None, pid)
