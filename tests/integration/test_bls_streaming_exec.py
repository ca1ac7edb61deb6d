"""BLS calls as Triton makes them, through real workers on real Kafka and Redis.

A caller model (``bls_probe``) makes the call its input names and reports what came back:
``InferenceRequest.exec(decoupled=True)`` sends its request at once, before the iteration
starts; ``await async_exec(decoupled=True)`` is a response iterator, iterated with ``async
for``, whose ``cancel()`` ends a wait for a response at once and cancels the called request;
a call's ``timeout``, or its caller's deadline, is the called request's deadline, and a call
past it answers Triton's error and cancels the called request.
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
from tests.support import (
    make_settings,
    running_workers,
    set_bls_environment,
    wait_for,
)

MARKER_CONFIG = """
name: "bls_marker"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
"""

MARKER_MODEL = '''
import os

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Decoupled: marks each request it gets (the file started-<request id> in its folder),
    then answers IN responses and closes the request."""

    def initialize(self, args):
        self.folder = args["model_repository"]

    def execute(self, requests):
        for request in requests:
            open(os.path.join(self.folder, "started-" + request.request_id()), "w").close()
            sender = request.get_response_sender()
            for i in range(int(request.inputs()[0].as_numpy()[0])):
                out = pb_utils.Tensor("OUT", np.array([i], np.int32))
                sender.send(pb_utils.InferenceResponse([out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

SILENT_CONFIG = """
name: "bls_silent"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
"""

SILENT_MODEL = '''
import os
import time

import triton_python_backend_utils as pb_utils

WAIT_S = 20.0


class TritonPythonModel:
    """Decoupled: answers nothing; marks each request it gets (the file started-<request
    id> in its folder), waits until it is cancelled (WAIT_S at most), marks a cancelled one
    (cancelled-<request id>), then closes it."""

    def initialize(self, args):
        self.folder = args["model_repository"]

    def execute(self, requests):
        for request in requests:
            open(os.path.join(self.folder, "started-" + request.request_id()), "w").close()
            t0 = time.monotonic()
            while not request.is_cancelled() and time.monotonic() - t0 < WAIT_S:
                time.sleep(0.01)
            if request.is_cancelled():
                open(os.path.join(self.folder, "cancelled-" + request.request_id()), "w").close()
            request.get_response_sender().send(
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            )
        return None
'''

TIMER_CONFIG = """
name: "bls_timer"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT64 dims: [ 1 ] } ]
"""

TIMER_MODEL = '''
import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Answers its request's timeout() (microseconds: the time its caller gave it)."""

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", np.array([r.timeout()], np.int64))]
            )
            for r in requests
        ]
'''

WAITER_CONFIG = """
name: "bls_waiter"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

WAITER_MODEL = SILENT_MODEL.replace(
    "Decoupled: answers nothing; waits", "Not decoupled: waits"
).replace(
    """            request.get_response_sender().send(
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            )
        return None""",
    """        stopped = pb_utils.TritonError("stopped", pb_utils.TritonError.CANCELLED)
        return [pb_utils.InferenceResponse(error=stopped) for _ in requests]""",
)

PROBE_CONFIG = """
name: "bls_probe"
backend: "python"
max_batch_size: 0
input [ { name: "WHAT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "REPORT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

PROBE_MODEL = '''
import asyncio
import glob
import json
import os
import time

import numpy as np

import triton_python_backend_utils as pb_utils

WAIT_S = 20.0
LATE_US = 3_000_000
"""A timeout the called models outlast (they started running well before it passes)."""


def call(model, value, batched=False, **options):
    """A call of ``model`` with IN = ``value`` (a batch of one row where it is batched)."""
    array = np.array([[value]] if batched else [value], np.int32)
    return pb_utils.InferenceRequest(
        model_name=model,
        requested_output_names=["OUT"],
        inputs=[pb_utils.Tensor("IN", array)],
        **options,
    )


def error_of(response):
    error = response.error()
    return None if error is None else {"code": error.code(), "message": error.message()}


class TritonPythonModel:
    """WHAT names the BLS call to make; REPORT is what came back, as JSON."""

    def initialize(self, args):
        self.repository = os.path.dirname(args["model_repository"])

    async def execute(self, requests):
        responses = []
        for request in requests:
            what = request.inputs()[0].as_numpy()[0].decode()
            report = json.dumps(await getattr(self, what)()).encode()
            out = pb_utils.Tensor("REPORT", np.array([report], np.object_))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses

    async def eager(self):
        """exec(decoupled=True), then a wait for the called model to get the request,
        before the iteration starts."""
        responses = call("bls_marker", 3).exec(decoupled=True)
        marks = os.path.join(self.repository, "bls_marker", "started-*")
        t0 = time.monotonic()
        while not glob.glob(marks) and time.monotonic() - t0 < WAIT_S:
            time.sleep(0.01)
        sent = bool(glob.glob(marks))
        outs = [r.output_tensors() for r in responses]
        return {"sent_before_iteration": sent, "responses": len([o for o in outs if o])}

    async def async_iteration(self):
        responses = await call("bls_marker", 3).async_exec(decoupled=True)
        got = []
        async for response in responses:
            got.append([int(t.as_numpy()[0]) for t in response.output_tensors()])
        return got

    async def async_cancel(self):
        """async for over endless, cancelled after its third response."""
        endless = call("endless", 0, batched=True, timeout=60_000_000)
        responses = await endless.async_exec(decoupled=True)
        taken = after = 0
        async for response in responses:
            if response.has_error():
                return error_of(response)
            if taken == 3:
                after += 1
                continue
            taken += 1
            if taken == 3:
                responses.cancel()
        return {"taken": taken, "after_cancel": after}

    async def cancel_waiting(self):
        """cancel() while another task waits for the first response, which never comes."""
        responses = await call("bls_silent", 0, timeout=60_000_000).async_exec(decoupled=True)
        waiting = asyncio.ensure_future(responses.__anext__())
        marks = os.path.join(self.repository, "bls_silent", "started-*")
        t0 = time.monotonic()
        while not glob.glob(marks) and time.monotonic() - t0 < WAIT_S:
            await asyncio.sleep(0.01)  # the called model runs the request, answering nothing
        responses.cancel()
        try:
            await waiting
        except StopAsyncIteration:
            return {"ended": True}
        return {"ended": False}

    async def timeout(self):
        response = call("bls_timer", 0, timeout=60_000_000).exec()
        return error_of(response) or int(response.output_tensors()[0].as_numpy()[0])

    async def inherit(self):
        response = call("bls_timer", 0).exec()
        return error_of(response) or int(response.output_tensors()[0].as_numpy()[0])

    async def late(self):
        return error_of(call("bls_waiter", 0, timeout=LATE_US).exec())

    async def late_stream(self):
        responses = call("bls_silent", 0, timeout=LATE_US).exec(decoupled=True)
        return [error_of(r) for r in responses]

    async def inherit_late(self):
        return error_of(call("bls_waiter", 0).exec())
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
    PLAZA_* environment that a worker's model process reads for BLS."""
    root = write_repository(tmp_path / "repository", "endless")
    for name, config, source in (
        ("bls_marker", MARKER_CONFIG, MARKER_MODEL),
        ("bls_silent", SILENT_CONFIG, SILENT_MODEL),
        ("bls_waiter", WAITER_CONFIG, WAITER_MODEL),
        ("bls_timer", TIMER_CONFIG, TIMER_MODEL),
        ("bls_probe", PROBE_CONFIG, PROBE_MODEL),
    ):
        write_model(root, name, config, source)
    settings = make_settings(kafka_bootstrap, redis_url, unique_id, repository=root)
    set_bls_environment(settings, monkeypatch)
    return settings


async def _report(client: PlazaClient, what: str, deadline_s: float | None = None) -> object:
    """bls_probe's report of the call ``what``; the probe's own request has the deadline
    ``deadline_s``, or none (published as a producer does, then awaited: an SDK infer's
    timeout_s would be its deadline)."""
    inputs = {"WHAT": np.array([what.encode()], np.object_)}
    options = {} if deadline_s is None else {"timeout_s": deadline_s}
    job = await client.submit("bls_probe", inputs, **options)
    result = await client.result(job, timeout_s=90)
    return json.loads(result.output("REPORT").to_numpy()[0])


def _marks(settings: PlazaSettings, model: str, prefix: str) -> list[Path]:
    return list((settings.repository / model).glob(prefix + "*"))


async def test_a_decoupled_exec_sends_its_request_before_it_is_iterated(
    settings: PlazaSettings,
) -> None:
    async with (
        running_workers(settings, "bls_probe", "bls_marker"),
        PlazaClient(settings) as client,
    ):
        report = await _report(client, "eager")
        assert report == {"sent_before_iteration": True, "responses": 3}
        # the marker closes its request alone: an empty final response
        assert await _report(client, "async_iteration") == [[0], [1], [2], []]


async def test_an_async_decoupled_exec_is_iterated_with_async_for_and_cancelled(
    settings: PlazaSettings,
) -> None:
    async with (
        running_workers(settings, "bls_probe", "endless", "bls_silent"),
        PlazaClient(settings) as client,
    ):
        assert await _report(client, "async_cancel") == {"taken": 3, "after_cancel": 0}
        await wait_for(lambda: bool(_marks(settings, "endless", "cancelled-")), 30, "endless")
        # a cancel() ends a wait for a response that would never come, and the called
        # request sees it (bls_silent waits 20 s for it at most)
        assert await _report(client, "cancel_waiting") == {"ended": True}
        await wait_for(lambda: bool(_marks(settings, "bls_silent", "cancelled-")), 30, "silent")
    (mark,) = _marks(settings, "endless", "cancelled-")
    assert 3 <= int(mark.read_text()) < 500


async def test_a_bls_call_carries_its_timeout_and_its_callers_deadline(
    settings: PlazaSettings,
) -> None:
    async with (
        running_workers(settings, "bls_probe", "bls_timer"),
        PlazaClient(settings) as client,
    ):
        assert await _report(client, "timeout") == 60_000_000  # Triton's microseconds
        assert await _report(client, "inherit") == 0  # no timeout, a caller without one
        inherited = await _report(client, "inherit", deadline_s=60)
    assert isinstance(inherited, int) and 0 < inherited <= 60_000_000


async def test_a_bls_call_past_its_deadline_answers_tritons_error_and_cancels_its_request(
    settings: PlazaSettings,
) -> None:
    unavailable = pb_utils.TritonError.UNAVAILABLE
    async with (
        running_workers(settings, "bls_probe", "bls_waiter", "bls_silent"),
        PlazaClient(settings) as client,
    ):
        late = await _report(client, "late")
        assert isinstance(late, dict) and late["code"] == unavailable
        # the waiter waits 20 s for a cancel at most: it sees the caller's
        await wait_for(lambda: len(_marks(settings, "bls_waiter", "cancelled-")) == 1, 30, "1")
        errors = await _report(client, "late_stream")  # the stream's one response
        assert isinstance(errors, list) and [e["code"] for e in errors] == [unavailable]
        await wait_for(lambda: bool(_marks(settings, "bls_silent", "cancelled-")), 30, "silent")
        # no timeout of its own: its caller's deadline ends it
        inherited = await _report(client, "inherit_late", deadline_s=4)
        assert isinstance(inherited, dict) and inherited["code"] == unavailable
        await wait_for(lambda: len(_marks(settings, "bls_waiter", "cancelled-")) == 2, 30, "2")
