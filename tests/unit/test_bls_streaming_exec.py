"""BLS calls' deadlines and streams in the model's process, without Kafka; and the worker's
log level reaching a running model's process.

A decoupled call's stream (``BlsStream``) runs over a fake SDK on a loop thread of its own,
as the real one runs: its request goes out when the stream is made, ``cancel()`` from
another thread ends a wait for a response at once and closes the SDK's stream (which is
what stores the caller's ``cancelled`` answer), and a deadline ends the stream with
Triton's error. The Python backend's child process follows the worker's log level from
one batch to the next.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncGenerator, Coroutine, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from plaza.client import make_request
from plaza.contract import InferRequest, InferResult
from plaza.log_settings import ISO8601, PlazaFormatter, copy_log, log_state
from plaza.repository import ModelRepository
from plaza.workers.backends import create_backend, pb_utils
from plaza.workers.backends.python_backend import PythonBackend
from plaza.workers.backends.python_stub import BlsStream, batch_deadline_ms, call_deadline_ms
from plaza.workers.device import CPU
from tests.python_models import write_model

T = TypeVar("T")
LIMIT_S = 10.0
"""The most any wait of these tests takes (each ends far sooner)."""


def test_a_bls_calls_deadline_is_the_earlier_of_its_timeout_and_its_callers() -> None:
    assert call_deadline_ms(2.5, None, 1_000) == 3_500
    assert call_deadline_ms(0.0, 5_000, 1_000) == 5_000  # Triton's timeout 0: none
    assert call_deadline_ms(10.0, 5_000, 1_000) == 5_000
    assert call_deadline_ms(1.0, 5_000, 1_000) == 2_000
    assert call_deadline_ms(0.0, None, 1_000) is None


def test_a_batchs_deadline_is_its_latest_and_none_when_a_request_has_none() -> None:
    def request(deadline_ms: int | None) -> InferRequest:
        return InferRequest(id="r", model="m", version="", inputs=(), deadline_ms=deadline_ms)

    assert batch_deadline_ms([request(5), request(9), request(7)]) == 9
    assert batch_deadline_ms([request(5), request(None)]) is None
    assert batch_deadline_ms([]) is None


class _Sdk:
    """The SDK's stream of one call: one response, then none until it is closed."""

    def __init__(self) -> None:
        self.sent = threading.Event()
        self.asked_again = threading.Event()
        self.closed = threading.Event()

    async def responses(
        self, req: InferRequest, wait_s: float
    ) -> AsyncGenerator[InferResult, None]:
        self.sent.set()
        try:
            yield InferResult(req.id, req.model, "1", final=False)
            self.asked_again.set()
            await asyncio.Event().wait()  # no other response ever comes
        finally:
            self.closed.set()


class _Thread:
    """A loop thread with the fake SDK, as ``BlsThread`` holds the real one."""

    def __init__(self) -> None:
        self.sdk = _Sdk()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def schedule(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(LIMIT_S)
        self.loop.close()


@pytest.fixture
def thread() -> Iterator[_Thread]:
    made = _Thread()
    yield made
    made.close()


def _stream(thread: _Thread, wait_s: float, deadline: bool) -> BlsStream:
    req = make_request("endless", {"IN": np.zeros((1, 1), np.int32)})
    return BlsStream(thread, req, wait_s, deadline)  # type: ignore[arg-type]


def test_a_bls_stream_sends_at_once_and_a_cancel_ends_a_wait_for_a_response(
    thread: _Thread,
) -> None:
    stream = _stream(thread, 30.0, deadline=False)
    assert thread.sdk.sent.wait(LIMIT_S)  # before anything was asked of the stream
    first = stream.next()
    assert first is not None and not first.has_error()
    got: list[pb_utils.InferenceResponse | None] = []
    waiting = threading.Thread(target=lambda: got.append(stream.next()))
    waiting.start()
    assert thread.sdk.asked_again.wait(LIMIT_S)  # that thread waits for the next response
    stream.cancel()
    waiting.join(LIMIT_S)
    assert not waiting.is_alive() and got == [None]
    assert thread.sdk.closed.is_set()  # the SDK's stream is closed: the request cancelled
    assert stream.next() is None
    stream.cancel()  # again: nothing more happens


def test_a_bls_stream_past_its_deadline_ends_with_tritons_error(thread: _Thread) -> None:
    stream = _stream(thread, 0.2, deadline=True)
    first = stream.next()
    assert first is not None and not first.has_error()
    late = stream.next()  # none comes: the deadline ends the wait
    assert late is not None
    error = late.error()
    assert error is not None and error.code() == pb_utils.TritonError.UNAVAILABLE
    assert "cancelled" in error.message()
    assert thread.sdk.closed.is_set()
    assert stream.next() is None


def test_an_async_iteration_of_a_bls_stream_is_cancelled_at_once(thread: _Thread) -> None:
    responses = pb_utils.ResponseIterator(_stream(thread, 30.0, deadline=False))

    async def iterate() -> tuple[bool, bool]:
        first = await anext(responses)
        waiting = asyncio.ensure_future(anext(responses))
        asked = thread.sdk.asked_again.wait
        assert await asyncio.get_running_loop().run_in_executor(None, asked, LIMIT_S)
        responses.cancel()  # while the next wait is on
        try:
            await waiting
        except StopAsyncIteration:
            return first.has_error(), True
        return first.has_error(), False

    assert asyncio.run(asyncio.wait_for(iterate(), LIMIT_S)) == (False, True)
    assert thread.sdk.closed.is_set()


def test_log_state_reads_what_copy_log_sets() -> None:
    root = logging.Logger("probe")
    handler = logging.StreamHandler()
    handler.setFormatter(PlazaFormatter())
    root.addHandler(handler)
    copy_log((logging.DEBUG, "ISO8601"), root)
    assert log_state(root) == (logging.DEBUG, "ISO8601")
    formatter = handler.formatter
    assert isinstance(formatter, PlazaFormatter) and formatter.datefmt == ISO8601
    copy_log((logging.WARNING, "default"), root)
    assert log_state(root) == (logging.WARNING, "default")


LEVEL_CONFIG = """
name: "log_level"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "LEVEL" data_type: TYPE_INT32 dims: [ 2 ] } ]
"""

LEVEL_MODEL = '''
import logging

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """LEVEL: this process's log level, and whether pb_utils.Logger.log_verbose shows."""

    def execute(self, requests):
        level = logging.getLogger().getEffectiveLevel()
        verbose = logging.getLogger("triton_python_backend_utils").isEnabledFor(logging.DEBUG)
        pb_utils.Logger.log_verbose("asked for the level")
        out = pb_utils.Tensor("LEVEL", np.array([level, int(verbose)], np.int32))
        return [pb_utils.InferenceResponse([out]) for _ in requests]
'''


def _levels(backend: PythonBackend) -> list[int]:
    request = make_request("log_level", {"IN": np.zeros(1, np.int32)})
    (answer,) = backend.execute_requests([request])
    assert isinstance(answer, tuple)
    return [int(v) for v in answer[0].to_numpy()]


def test_a_running_models_process_logs_at_the_workers_level_of_each_batch(
    tmp_path: Path,
) -> None:
    root = logging.getLogger()
    before = root.level
    mv = ModelRepository(write_model(tmp_path, "log_level", LEVEL_CONFIG, LEVEL_MODEL))
    backend = create_backend(mv.served_versions("log_level")[0], CPU)
    assert isinstance(backend, PythonBackend)
    try:
        root.setLevel(logging.WARNING)
        backend.load()  # the process starts at WARNING
        assert _levels(backend) == [logging.WARNING, 0]
        root.setLevel(logging.DEBUG)  # the log settings changed at run time
        assert _levels(backend) == [logging.DEBUG, 1]
        root.setLevel(logging.ERROR)
        assert _levels(backend) == [logging.ERROR, 0]
    finally:
        root.setLevel(before)
        backend.unload()
