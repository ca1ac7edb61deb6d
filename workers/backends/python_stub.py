"""The Python model's own process: runs a Triton ``model.py`` for the Python backend.

Started by ``PythonBackend`` as ``python -m plaza.workers.backends.python_stub READ_FD
WRITE_FD PARENT_PID LOG_LEVEL`` (the worker's log level, a number: ``pb_utils.Logger`` and
the rest of this process log at it, to stderr). It puts ``pb_utils`` into ``sys.modules`` as
``triton_python_backend_utils``, loads ``model.py`` and answers the worker's frames
(``python_channel``): ``initialize``, ``execute`` (a batch of Plaza requests in, one result
per request out) and ``finalize``; an answer carries the model's custom metrics
(``pb_metrics``) when they changed. A decoupled model's ``execute`` answers through its
requests' response senders instead: each ``send`` goes to the worker at once as a frame of
its own (``{"response": i, "final": ..., "result": ...}``, ``result`` absent for a final
flag without a response), and the batch's answer (``{"ok": true}``) follows once every
request got its final flag. While any batch runs, the worker's cancel frames wait on the
pipe until the model asks ``is_cancelled()`` (``_Cancels``). What model.py does wrong
becomes an error answer; what kills this process (``os._exit``, a segfault) the worker sees
as a closed pipe. An ``async def execute`` runs to its end on this process's own event
loop, one batch at a time (the same loop every call, so a model may keep loop-bound
resources between calls), where ``async_exec`` BLS calls run side by side. The model loading
API (``pb_utils.load_model``, ``unload_model``, ``is_model_ready``: ``pb_model_loader``)
works in ``initialize`` and ``execute``; ``finalize`` refuses it, as Triton does.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import inspect
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

from plaza.codec import decode_request, encode_result
from plaza.contract import ErrorInfo, InferRequest, InferResult
from plaza.errors import PlazaError
from plaza.log_settings import configure_logging
from plaza.sequence_batching import PARAM_END, PARAM_ID, PARAM_START
from plaza.settings import PlazaSettings
from plaza.tensors import Tensor as WireTensor
from plaza.workers.backends import pb_metrics, pb_utils
from plaza.workers.backends.pb_model_loader import ModelLoader
from plaza.workers.backends.python_channel import Channel, ChannelClosed
from plaza.workers.backends.python_errors import plaza_code, triton_code

MODULE_NAME = "triton_python_backend_utils"
BLS_DEFAULT_TIMEOUT_S = 30.0
"""How long a BLS call waits for its answer when the request sets no ``timeout``."""
PARENT_CHECK_S = 0.5
"""How often the process checks that the worker that started it still runs."""
PARENT_EXIT_S = 0.2
"""How long the process, its pipe closed by the worker, looks whether the worker is exiting
(its group is then this process's to end) before it exits (the worker ends its group)."""


class ModelHost:
    """The loaded model and what it needs: its config facts and the BLS client."""

    def __init__(self) -> None:
        self.model: Any = None
        self.name = ""
        self.version = 0
        self.outputs: list[str] = []
        self.bls: BlsClient | None = None
        self.loader: ModelLoader | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        """Where an ``async def execute`` runs (made for the first one)."""
        self.decoupled = False
        self.channel: Channel | None = None
        """Where a decoupled model's responses go as they are sent."""

    def handle(self, message: dict[str, Any]) -> dict[str, Any]:
        """The answer to one frame, with the model's custom metrics when they changed."""
        answer = self._handle(message)
        snapshot = pb_metrics.registry.snapshot()
        if snapshot is not None:
            answer["metrics"] = snapshot
        return answer

    def _handle(self, message: dict[str, Any]) -> dict[str, Any]:
        op = message.get("op")
        try:
            if op == "initialize":
                return self.initialize(message)
            if op == "execute" and self.decoupled:
                return self.execute_decoupled(message["requests"])
            if op == "execute":
                return self.execute(message["requests"])
            if op == "finalize":
                return self.finalize()
        except Exception as exc:
            return _failure(f"{type(exc).__name__}: {exc}")
        return _failure(f"unknown operation {op!r}")

    def initialize(self, message: dict[str, Any]) -> dict[str, Any]:
        self.name = message["model_name"]
        self.version = int(message["model_version"])
        self.outputs = list(message["outputs"])
        self.decoupled = bool(message.get("decoupled", False))
        settings = partial(process_settings, message.get("settings", ""), message["repository"])
        self.bls = BlsClient(settings)
        pb_utils.set_bls_call(self.bls, self.bls.stream)
        self.loader = ModelLoader(settings)
        pb_utils.set_model_loading(self.loader)
        path = Path(message["model_file"])
        try:
            module = load_module(path)
            cls = getattr(module, "TritonPythonModel", None)
            if cls is None:
                return _failure(f"{path} defines no class TritonPythonModel")
            self.model = cls()
            if hasattr(self.model, "initialize"):
                self.model.initialize(dict(message["args"]))
        except Exception as exc:
            return _failure(f"loading {path} failed: {type(exc).__name__}: {exc}")
        if not callable(getattr(self.model, "execute", None)):
            return _failure(f"{path}: TritonPythonModel has no execute method")
        return {"ok": True}

    def execute(self, encoded: Sequence[bytes]) -> dict[str, Any]:
        assert self.channel is not None
        requests = [decode_request(raw) for raw in encoded]
        cancels = _Cancels(self.channel)
        built = [self._try_pb_request(r, cancels) for r in requests]
        pb_requests = [b for b in built if isinstance(b, pb_utils.InferenceRequest)]
        try:
            responses = self.model.execute(pb_requests) if pb_requests else []
            if inspect.isawaitable(responses):  # async def execute
                responses = self._event_loop().run_until_complete(responses)
        except Exception as exc:
            return _failure(f"execute raised {type(exc).__name__}: {exc}")
        finally:
            cancels.close()
        if not isinstance(responses, list | tuple) or len(responses) != len(pb_requests):
            got = len(responses) if isinstance(responses, list | tuple) else type(responses)
            return _failure(
                f"execute must return a list of one InferenceResponse per request: got {got} "
                f"for {len(pb_requests)} requests"
            )
        answers = iter(responses)  # in the order of the requests the model was given
        results = []
        for req, made in zip(requests, built, strict=True):
            if isinstance(made, pb_utils.TritonError):
                results.append(self._result(req, pb_utils.InferenceResponse(error=made)))
            else:
                results.append(self._result(req, next(answers)))
        return {"results": [encode_result(res) for res in results]}

    def execute_decoupled(self, encoded: Sequence[bytes]) -> dict[str, Any]:
        """Run a decoupled model's batch: its responses leave as the model sends them; the
        answer comes once every request has its final flag (or ``execute`` failed: the
        worker then closes the requests still open with the error)."""
        assert self.channel is not None
        requests = [decode_request(raw) for raw in encoded]
        cancels = _Cancels(self.channel)
        responses = _Responses(self.channel, requests, self._result, cancels)
        pb_requests = []
        for req, sender in zip(requests, responses.senders.values(), strict=True):
            made = self._try_pb_request(req, cancels)
            if isinstance(made, pb_utils.TritonError):  # closed at once with its error, alone
                final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                sender.send(pb_utils.InferenceResponse(error=made), flags=final)
                continue
            made._sender = sender
            pb_requests.append(made)
        try:
            returned = self.model.execute(pb_requests) if pb_requests else None
            if inspect.isawaitable(returned):
                returned = self._event_loop().run_until_complete(returned)
            if returned is not None:
                return _failure(
                    "a decoupled model's execute must return None (its responses go through "
                    f"each request's response sender); it returned a {type(returned).__name__}"
                )
            self._wait(responses.done)
        except Exception as exc:
            return _failure(f"execute raised {type(exc).__name__}: {exc}")
        finally:
            responses.close()
            cancels.close()
        return {"ok": True}

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
        return self.loop

    def _wait(self, done: threading.Event) -> None:
        """Until every request of the batch got its final flag: on the loop of an async
        model (its tasks may still be sending), else on the senders' threads."""
        if self.loop is None:
            done.wait()
            return
        self.loop.run_until_complete(self.loop.run_in_executor(None, done.wait))

    def finalize(self) -> dict[str, Any]:
        pb_utils.set_model_loading(None, "finalize")
        try:
            if self.model is not None and hasattr(self.model, "finalize"):
                self.model.finalize()
        finally:
            if self.bls is not None:
                self.bls.close()
            if self.loader is not None:
                self.loader.close()
            if self.loop is not None:
                self.loop.close()
        return {"ok": True}

    def _try_pb_request(
        self, req: InferRequest, cancels: _Cancels
    ) -> pb_utils.InferenceRequest | pb_utils.TritonError:
        """``_pb_request``, or the error of a request that cannot be handed to the model
        (it is answered with it alone: one bad request never fails its batch-mates)."""
        try:
            return self._pb_request(req, cancels)
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
            message = f"request {req.id!r} cannot be given to the model: {why}"
            return pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG)

    def _pb_request(self, req: InferRequest, cancels: _Cancels) -> pb_utils.InferenceRequest:
        inputs = []
        for t in req.inputs:
            array = t.to_numpy()
            if not array.flags.writeable:  # a view of the frame: model code may write to it
                array = array.copy()
            inputs.append(pb_utils.Tensor(t.name, array))
        sequence = req.parameters.get(PARAM_ID, 0)
        request = pb_utils.InferenceRequest(
            model_name=self.name,
            requested_output_names=list(req.outputs) or self.outputs,
            inputs=inputs,
            request_id=req.id,
            correlation_id=sequence if isinstance(sequence, int | str) else 0,
            model_version=int(req.version or self.version),
            flags=request_flags(req),
            timeout=request_timeout_us(req),
            parameters=json.dumps(req.parameters),
        )
        request._cancelled = partial(cancels.cancelled, req.id)
        return request

    def _result(self, req: InferRequest, response: Any) -> InferResult:
        def failed(code: str, message: str) -> InferResult:
            error = ErrorInfo(code, message)
            return InferResult(id=req.id, model=self.name, version="", error=error)

        if not isinstance(response, pb_utils.InferenceResponse):
            return failed(
                "model_error",
                f"execute returned a {type(response).__name__}, not a pb_utils.InferenceResponse",
            )
        error = response.error()
        if error is not None:
            return failed(plaza_code(error.code()), error.message())
        try:
            outputs = tuple(
                WireTensor.from_numpy(t.name(), t.as_numpy()) for t in response.output_tensors()
            )
        except PlazaError as exc:
            return failed("model_error", f"an output cannot be sent: {exc.message}")
        params = response._values  # checked when the model made the response
        return InferResult(req.id, self.name, "", outputs, parameters=params)


class _Cancels:
    """One batch's cancels, read when the model asks (``is_cancelled()``, from any thread).
    Until ``close`` the worker sends this process nothing but cancel frames (``{"op":
    "cancel", "ids": [...]}``: those requests' callers went away), so a question reads the
    frames waiting, without blocking, and answers from them: a batch whose model never asks
    costs nothing, and the frames it leaves unread the main loop skips."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._lock = threading.Lock()
        self._ids: set[str] = set()
        self._open = True

    def cancelled(self, request_id: str) -> bool:
        with self._lock:
            while self._open and self._channel.readable():
                try:
                    frame = self._channel.recv()
                except ChannelClosed:  # the worker went away: the main loop ends the process
                    self._open = False
                    break
                if frame.get("op") == "cancel":
                    self._ids.update(str(rid) for rid in frame.get("ids", ()))
            return request_id in self._ids

    def close(self) -> None:
        """The batch ended: the main loop reads the channel again."""
        with self._lock:
            self._open = False


class _Responses:
    """One decoupled batch's response senders: each response goes to the worker as a frame
    the moment it is sent (one frame at a time, whichever thread sends it). ``done`` once
    every request is closed."""

    def __init__(
        self,
        channel: Channel,
        requests: Sequence[InferRequest],
        to_result: Callable[[InferRequest, Any], InferResult],
        cancels: _Cancels,
    ) -> None:
        self._channel = channel
        self._to_result = to_result
        self._lock = threading.Lock()
        self._open = len(requests)
        self.done = threading.Event()
        self.senders = {
            r.id: pb_utils.InferenceResponseSender(
                r.id, partial(self._deliver, i, r), partial(cancels.cancelled, r.id)
            )
            for i, r in enumerate(requests)
        }
        if not requests:
            self.done.set()

    def _deliver(self, i: int, req: InferRequest, response: Any, final: bool) -> None:
        frame: dict[str, Any] = {"response": i, "final": final}
        if response is not None:
            frame["result"] = encode_result(self._to_result(req, response))
        with self._lock:
            self._channel.send(frame)
            if final:
                self._open -= 1
                if self._open == 0:
                    self.done.set()

    def close(self) -> None:
        """The batch ended: no more sends."""
        for sender in self.senders.values():
            sender.close()


class BlsClient:
    """``InferenceRequest.exec``: a Plaza SDK client, made on the first call."""

    def __init__(self, settings: Callable[[], PlazaSettings]) -> None:
        self._settings = settings
        self._client: Any = None

    def __call__(self, request: pb_utils.InferenceRequest, timeout_s: float) -> Any:
        try:
            return self._call(request, timeout_s or BLS_DEFAULT_TIMEOUT_S)
        except PlazaError as exc:
            error = pb_utils.TritonError(exc.message, triton_code(exc.code))
            return pb_utils.InferenceResponse(error=error)

    def stream(self, request: pb_utils.InferenceRequest, timeout_s: float) -> Iterator[Any]:
        """``InferenceRequest.exec(decoupled=True)``: the called model's responses as they
        come, then an empty one when it closed the request without a response (as Triton's
        iterator ends); a failure of the call itself is one last error response."""
        final = False
        try:
            responses = self._sdk().infer_stream(
                request.model_name,
                self._inputs(request),
                timeout_s=timeout_s or BLS_DEFAULT_TIMEOUT_S,
                raise_on_error=False,
                **self._options(request),
            )
            # Closed early (``ResponseIterator.cancel``): the SDK's stream is closed at once,
            # which stores the caller's cancelled answer for the called request.
            with contextlib.closing(responses):
                for result in responses:
                    final = result.final
                    yield _response(result)
        except PlazaError as exc:
            error = pb_utils.TritonError(exc.message, triton_code(exc.code))
            yield pb_utils.InferenceResponse(error=error)
            return
        if not final:  # the SDK leaves the empty final response out
            yield pb_utils.InferenceResponse()

    def _call(self, request: pb_utils.InferenceRequest, timeout_s: float) -> Any:
        result = self._sdk().infer(
            request.model_name,
            self._inputs(request),
            timeout_s=timeout_s,
            raise_on_error=False,
            **self._options(request),
        )
        return _response(result)

    @staticmethod
    def _inputs(request: pb_utils.InferenceRequest) -> list[WireTensor]:
        return [WireTensor.from_numpy(t.name(), t.as_numpy()) for t in request.inputs()]

    @staticmethod
    def _options(request: pb_utils.InferenceRequest) -> dict[str, Any]:
        params = json.loads(request.parameters() or "{}")
        return {
            "version": "" if request.model_version < 0 else str(request.model_version),
            "outputs": request.requested_output_names(),
            "parameters": {
                **{k: v for k, v in params.items() if isinstance(v, str | int | float | bool)},
                **sequence_parameters(request),
            },
        }

    def _sdk(self) -> Any:
        if self._client is None:
            from plaza.client import SyncPlazaClient

            self._client = SyncPlazaClient(self._settings())
        return self._client

    def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None


def request_flags(req: InferRequest) -> int:
    """Triton's request flags of a Plaza request: its ``sequence_start`` and
    ``sequence_end`` parameters as TRITONSERVER_REQUEST_FLAG_SEQUENCE_START (1) and _END (2)."""
    flags = 0
    if req.parameters.get(PARAM_START) is True:
        flags |= pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
    if req.parameters.get(PARAM_END) is True:
        flags |= pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
    return flags


def request_timeout_us(req: InferRequest) -> int:
    """Triton's request timeout, in microseconds, of a Plaza request: the time its caller
    gave it (from when it was made to its deadline; whole milliseconds, as the deadline
    holds it); 0 when it has no deadline."""
    if req.deadline_ms is None or not req.created_ms:
        return 0
    return max(0, req.deadline_ms - req.created_ms) * 1000


def sequence_parameters(request: pb_utils.InferenceRequest) -> dict[str, int | str | bool]:
    """A BLS request's ``correlation_id`` and sequence flags as the Plaza parameters a
    sequence model reads (``sequence_id``, ``sequence_start``, ``sequence_end``); none for
    a request outside a sequence (correlation id 0 or "", no flags)."""
    params: dict[str, int | str | bool] = {}
    correlation = request.correlation_id()
    if correlation:
        params[PARAM_ID] = correlation
    if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
        params[PARAM_START] = True
    if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
        params[PARAM_END] = True
    return params


def process_settings(settings_json: str, repository: str) -> PlazaSettings:
    """The worker's settings, as it sent them (``settings_json``), for this process's BLS
    client and model loader; without them, its environment (PLAZA_*), which this process
    inherited."""
    if settings_json:
        return PlazaSettings.model_validate(json.loads(settings_json))
    return PlazaSettings(repository=Path(repository))


def _response(result: InferResult) -> Any:
    """A Plaza result as the ``pb_utils.InferenceResponse`` a BLS caller gets."""
    if result.error is not None:
        error = pb_utils.TritonError(result.error.message, triton_code(result.error.code))
        return pb_utils.InferenceResponse(error=error)
    tensors = [pb_utils.Tensor(t.name, t.to_numpy()) for t in result.outputs]
    return pb_utils.InferenceResponse(output_tensors=tensors)


def _failure(message: str) -> dict[str, Any]:
    return {"error": message, "traceback": traceback.format_exc()}


def load_module(path: Path) -> ModuleType:
    """model.py as the module ``model``, its folder first on sys.path (for its own imports)."""
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location("model", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["model"] = module
    spec.loader.exec_module(module)
    return module


def _exit_with_parent(parent_pid: int) -> None:
    """Exit when the worker does, even while model code is busy: a thread watches the
    parent pid (PR_SET_PDEATHSIG would follow the worker's thread that started this process,
    and executor threads come and go)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_CHECK_S)
        _end_orphaned_group()

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _end_orphaned_group() -> None:
    """The worker is gone: SIGKILL to this process's group, this process included, so that
    what model.py forked ends with it (no worker is left to end it). Only as the group's
    leader (the worker starts this process in a session of its own)."""
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os._exit(0)


def _closed_by(parent_pid: int) -> None:
    """The worker closed its end of the pipe: it stops this process (and then ends its group
    itself), or it is exiting: its descriptors close a moment before this process is
    handed to another parent, so that is waited for (PARENT_EXIT_S at most)."""
    deadline = time.monotonic() + PARENT_EXIT_S
    while os.getppid() == parent_pid:
        if time.monotonic() >= deadline:
            return
        time.sleep(PARENT_EXIT_S / 20)
    _end_orphaned_group()


def _configure_logging(argv: Sequence[str]) -> None:
    """This process's log, as the worker's: its level (the fifth argument; INFO without
    it), one line a record on stderr, which the worker's stderr is."""
    configure_logging("INFO")
    if len(argv) > 4:
        logging.getLogger().setLevel(int(argv[4]))


def main(argv: Sequence[str]) -> int:
    read_fd, write_fd, parent_pid = (int(a) for a in argv[1:4])
    _configure_logging(argv)
    _exit_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker stops it (finalize), not ^C
    sys.modules[MODULE_NAME] = pb_utils
    channel = Channel(read_fd, write_fd)
    host = ModelHost()
    host.channel = channel
    while True:
        try:
            message = channel.recv()
        except ChannelClosed:
            _closed_by(parent_pid)
            return 0  # the worker closed its end: nothing is left to answer
        if message.get("op") == "cancel":
            continue  # for a batch that ended before it came, or whose model never asked
        channel.send(host.handle(message))
        if message.get("op") == "finalize":
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
