"""The Python model's own process: runs a Triton ``model.py`` for the Python backend.

Started by ``PythonBackend`` as ``python -m plaza.workers.backends.python_stub READ_FD
WRITE_FD PARENT_PID LOG_LEVEL WARNINGS ERRORS`` (the worker's log level, a number, and
whether its WARNING and its ERROR records pass, 1 or 0: its ``log_warnings`` and
``log_errors``; ``pb_utils.Logger`` and the rest of this process log so, to stderr; each
``initialize`` and ``execute`` frame says the worker's level, time format and those two
again, ``log``, which this process then follows, so a change of the log settings at run
time reaches it with the next batch). It puts
``pb_utils`` into ``sys.modules`` as ``triton_python_backend_utils``, loads ``model.py`` and
answers the worker's frames (``python_channel``): ``initialize``, ``execute`` (a batch of
Plaza requests in, one result per request out) and ``finalize``; an answer carries the
model's custom metrics (``pb_metrics``) when they changed. A decoupled model's ``execute``
answers through its requests' response senders instead: each ``send`` goes to the worker at
once as a frame of its own (``{"response": i, "final": ..., "result": ...}``, ``result``
absent for a final flag without a response), and the batch's answer (``{"ok": true}``)
follows once every request got its final flag. While any batch runs, the worker's cancel
frames wait on the pipe until the model asks ``is_cancelled()`` (``_Cancels``). What
model.py does wrong becomes an error answer; what kills this process (``os._exit``, a
segfault) the worker sees as a closed pipe. An ``async def execute`` runs to its end on this
process's own event loop, one batch at a time (the same loop every call, so a model may keep
loop-bound resources between calls), where ``async_exec`` BLS calls run side by side. BLS
calls (``BlsClient``) run on the SDK's own loop thread; while a batch runs, its deadline
bounds them (``batch_deadline_ms``). The model loading API (``pb_utils.load_model``,
``unload_model``, ``is_model_ready``: ``pb_model_loader``) works in ``initialize`` and
``execute``; ``finalize`` refuses it, as Triton does.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import inspect
import json
import logging
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Iterator, Sequence
from concurrent.futures import CancelledError
from concurrent.futures import Future as ConcurrentFuture
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import msgspec

from plaza.client import PlazaClient, SyncPlazaClient, make_request
from plaza.codec import decode_request, encode_result
from plaza.contract import ErrorInfo, InferRequest, InferResult
from plaza.errors import DeadlineExceeded, PlazaError, Unavailable
from plaza.log_settings import (
    LogSettings,
    PlazaFormatter,
    configure_logging,
    copy_log,
    severity_filter,
)
from plaza.sequence_batching import PARAM_END, PARAM_ID, PARAM_START
from plaza.settings import PlazaSettings
from plaza.tensors import Tensor as WireTensor
from plaza.workers.backends import pb_metrics, pb_utils
from plaza.workers.backends.pb_model_loader import ModelLoader
from plaza.workers.backends.python_channel import Channel, ChannelClosed
from plaza.workers.backends.python_errors import plaza_code, triton_code

T = TypeVar("T")
MODULE_NAME = "triton_python_backend_utils"
BLS_DEFAULT_TIMEOUT_S = 30.0
"""How long a BLS call waits for its answer (a decoupled call: for each response) when it
has no deadline (no ``timeout``, and a caller without one)."""
BLS_GRACE_S = 1.0
"""How much longer than the BLS caller waits the SDK's own limit is: the caller's ends the
call first, cancelling its request."""
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
        """The answer to one frame, with the model's custom metrics that changed, if any. A
        batch's frame says how the worker logs now (``log_state``): this process logs so
        from then on (``pb_utils.Logger`` included)."""
        _follow_log(message.get("log"))
        answer = self._handle(message)
        changes = pb_metrics.registry.changes()
        if changes is not None:
            answer["metrics"] = changes
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
            with self._calls_within(requests):
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
            with self._calls_within(requests):
                returned = self.model.execute(pb_requests) if pb_requests else None
                if inspect.isawaitable(returned):
                    returned = self._event_loop().run_until_complete(returned)
                if returned is not None:
                    return _failure(
                        "a decoupled model's execute must return None (its responses go "
                        "through each request's response sender); it returned a "
                        f"{type(returned).__name__}"
                    )
                self._wait(responses.done)
        except Exception as exc:
            return _failure(f"execute raised {type(exc).__name__}: {exc}")
        finally:
            responses.close()
            cancels.close()
        return {"ok": True}

    @contextlib.contextmanager
    def _calls_within(self, requests: Sequence[InferRequest]) -> Iterator[None]:
        """While a batch runs, its BLS calls end by its deadline (``batch_deadline_ms``)."""
        if self.bls is None:  # no initialize: no BLS either
            yield
            return
        self.bls.caller_deadline_ms = batch_deadline_ms(requests)
        try:
            yield
        finally:
            self.bls.caller_deadline_ms = None

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


class BlsSdk(PlazaClient):
    """The SDK client of BLS calls: it sends a request the call made, with the deadline the
    call chose (the SDK's own ``infer`` sets none)."""

    async def call(self, req: InferRequest, wait_s: float) -> InferResult:
        return await self.producer.infer(req, await self._spec(req.model), wait_s)

    async def responses(
        self, req: InferRequest, wait_s: float
    ) -> AsyncGenerator[InferResult, None]:
        """Each response of ``req`` as it comes, the empty final one included; closed
        early, the request's ``cancelled`` answer is stored."""
        stream = self.producer.infer_stream(req, await self._spec(req.model), wait_s)
        async with contextlib.aclosing(stream):
            async for result in stream:
                yield result


class BlsThread(SyncPlazaClient):
    """``BlsSdk`` on its own event loop thread (``SyncPlazaClient``'s), where BLS calls'
    coroutines run; ``close`` ends the ones still waiting."""

    @staticmethod
    async def _make(settings: PlazaSettings | None) -> PlazaClient:
        return BlsSdk(settings)

    @property
    def sdk(self) -> BlsSdk:
        assert isinstance(self._client, BlsSdk)
        return self._client

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """``coro`` on the SDK's loop, waited for."""
        return self._call(coro)

    def schedule(self, coro: Coroutine[Any, Any, T]) -> ConcurrentFuture[T]:
        """``coro`` on the SDK's loop, not waited for; Unavailable once closed."""
        if self._closed:
            coro.close()
            raise Unavailable("the BLS client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)


class BlsClient:
    """``InferenceRequest.exec``: the SDK on a thread of its own, made on the first call.

    A call's deadline is the earlier of its own ``timeout`` and ``caller_deadline_ms`` (the
    batch's that the model runs); the called request carries it, so that its worker expires
    it as its queue policy says, and the caller waits until then at most
    (``BLS_DEFAULT_TIMEOUT_S`` without one). A caller that stops waiting cancels the called
    request, and its answer is a TritonError of the ``timeout`` code (``UNAVAILABLE``)."""

    def __init__(self, settings: Callable[[], PlazaSettings]) -> None:
        self._settings = settings
        self._thread: BlsThread | None = None
        self._making = threading.Lock()
        self.caller_deadline_ms: int | None = None
        """The deadline of the batch the model runs now (``batch_deadline_ms``)."""

    def __call__(
        self, request: pb_utils.InferenceRequest, timeout_s: float
    ) -> pb_utils.InferenceResponse:
        try:
            req, wait_s = self._request(request, timeout_s)
            thread = self._sdk()
            result = thread.run(_within(wait_s, thread.sdk.call(req, wait_s + BLS_GRACE_S)))
        except PlazaError as exc:
            return _error_response(exc)
        return _response(result)

    def stream(
        self, request: pb_utils.InferenceRequest, timeout_s: float
    ) -> pb_utils.ResponseStream | Iterator[pb_utils.InferenceResponse]:
        """``InferenceRequest.exec(decoupled=True)``: the call is sent now, its responses
        taken as they come (``BlsStream``); a call that cannot be sent is one error
        response."""
        try:
            req, wait_s = self._request(request, timeout_s)
            return BlsStream(self._sdk(), req, wait_s, req.deadline_ms is not None)
        except PlazaError as exc:
            return iter([_error_response(exc)])

    def _request(
        self, request: pb_utils.InferenceRequest, timeout_s: float
    ) -> tuple[InferRequest, float]:
        """The Plaza request of a BLS call, its deadline set, and how long the caller waits
        for it; DeadlineExceeded (sent nothing) when that deadline has passed."""
        req = make_request(request.model_name, self._inputs(request), **self._options(request))
        deadline_ms = call_deadline_ms(timeout_s, self.caller_deadline_ms, req.created_ms)
        if deadline_ms is None:
            return req, BLS_DEFAULT_TIMEOUT_S
        wait_s = (deadline_ms - time.time() * 1000) / 1000
        if wait_s <= 0:
            raise DeadlineExceeded(
                f"BLS call to model {request.model_name!r}: its deadline passed before it was "
                "sent (the timeout it was given, or its caller's deadline)"
            )
        return msgspec.structs.replace(req, deadline_ms=deadline_ms), wait_s

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

    def _sdk(self) -> BlsThread:
        with self._making:  # gathered async_exec calls make one client, not one each
            if self._thread is None:
                self._thread = BlsThread(self._settings())
            return self._thread

    def close(self) -> None:
        if self._thread is not None:
            with contextlib.suppress(Exception):
                self._thread.close()
            self._thread = None


class BlsStream:
    """One ``InferenceRequest.exec(decoupled=True)`` call (a ``pb_utils.ResponseStream``):
    sent when made, its responses taken one at a time. Its state lives on the SDK's loop,
    so ``cancel`` from any thread ends a wait for a response at once: the step waiting is
    cancelled, which stores the caller's ``cancelled`` answer for the called request.

    ``deadline``: the call has one, ``wait_s`` from now, which bounds the whole stream;
    else ``wait_s`` bounds each wait for a response. A wait that ends there ends the stream
    with a ``timeout`` error response, its request cancelled."""

    def __init__(self, thread: BlsThread, req: InferRequest, wait_s: float, deadline: bool):
        self._thread = thread
        self._model = req.model
        self._wait_s = wait_s
        self._until: float | None = time.monotonic() + wait_s if deadline else None
        self._results = thread.sdk.responses(req, wait_s + BLS_GRACE_S)
        self._step: asyncio.Future[InferResult | None] | None = None
        """The step taking the next response, started ahead (the first one, at once)."""
        self._over = False
        self._closed = False
        self._failed = False
        """On the caller's side: the SDK failed and its error response was handed over."""
        thread.schedule(self._start())  # sends the request now

    # -- the caller's side (any thread) ----------------------------------------------------
    def next(self) -> pb_utils.InferenceResponse | None:
        if self._failed:
            return None
        try:
            return self._thread.schedule(self._take()).result()
        except CancelledError:  # the SDK's loop is closing (finalize)
            return None
        except PlazaError as exc:
            self._failed = True
            return _error_response(exc)

    async def anext(self) -> pb_utils.InferenceResponse | None:
        if self._failed:
            return None
        try:
            return await asyncio.wrap_future(self._thread.schedule(self._take()))
        except PlazaError as exc:
            self._failed = True
            return _error_response(exc)

    def cancel(self) -> None:
        with contextlib.suppress(PlazaError, CancelledError):
            self._thread.schedule(self._cancel()).result()

    # -- on the SDK's loop -----------------------------------------------------------------
    async def _start(self) -> None:
        """Take the first response ahead, which publishes the request."""
        if not self._over and self._step is None:
            self._step = asyncio.ensure_future(_next_of(self._results))

    async def _take(self) -> pb_utils.InferenceResponse | None:
        if self._over:
            return None
        if self._step is None:  # else started ahead; ``_cancel`` reaches it while awaited
            self._step = asyncio.ensure_future(_next_of(self._results))
        try:
            async with asyncio.timeout(self._left()):
                result = await self._step
        except TimeoutError:
            self._over = True
            return _error_response(self._late())
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self._over and current is not None and not current.cancelling():
                return None  # ``_cancel`` cancelled the step
            self._over = True
            raise
        except PlazaError as exc:
            self._over = True
            return _error_response(exc)
        finally:
            self._step = None
            if self._over:
                await self._close()
        if result is None or result.final:
            self._over = True
            await self._close()
        return None if result is None else _response(result)

    async def _cancel(self) -> None:
        self._over = True
        step = self._step
        if step is not None:
            step.cancel()
            await asyncio.wait([step])
        await self._close()

    async def _close(self) -> None:
        """Close the SDK's stream, once (its request cancelled unless it was answered)."""
        if not self._closed:
            self._closed = True
            await self._results.aclose()

    def _left(self) -> float:
        return self._wait_s if self._until is None else max(0.0, self._until - time.monotonic())

    def _late(self) -> DeadlineExceeded:
        return DeadlineExceeded(
            f"BLS call to model {self._model!r}: no response within {self._wait_s:g} s (the "
            "timeout it was given, or its caller's deadline); the called request was cancelled"
        )


async def _next_of(results: AsyncIterator[InferResult]) -> InferResult | None:
    """The next result, None at the end."""
    try:
        return await anext(results)
    except StopAsyncIteration:
        return None


async def _within(wait_s: float, call: Coroutine[Any, Any, InferResult]) -> InferResult:
    """``call``'s answer within ``wait_s``; past it the call is cancelled (its request's
    ``cancelled`` answer stored) and DeadlineExceeded raised."""
    try:
        async with asyncio.timeout(wait_s):
            return await call
    except TimeoutError:
        raise DeadlineExceeded(
            f"BLS call: no answer within {wait_s:g} s (the timeout it was given, or its "
            "caller's deadline); the called request was cancelled"
        ) from None


def call_deadline_ms(timeout_s: float, caller_ms: int | None, now_ms: int) -> int | None:
    """A BLS call's deadline (epoch ms): ``now_ms`` plus its own timeout (0: none), or its
    caller's deadline, whichever comes first; None when it has neither."""
    own = now_ms + math.ceil(timeout_s * 1000) if timeout_s > 0 else None
    deadlines = [d for d in (own, caller_ms) if d is not None]
    return min(deadlines) if deadlines else None


def batch_deadline_ms(requests: Sequence[InferRequest]) -> int | None:
    """The deadline of a batch's BLS calls: its requests' latest (a call may serve any of
    them); None when one of them has none."""
    deadlines = [r.deadline_ms for r in requests]
    if not deadlines or any(d is None for d in deadlines):
        return None
    return max(d for d in deadlines if d is not None)


def _error_response(exc: PlazaError) -> pb_utils.InferenceResponse:
    error = pb_utils.TritonError(exc.message, triton_code(exc.code))
    return pb_utils.InferenceResponse(error=error)


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


def _response(result: InferResult) -> pb_utils.InferenceResponse:
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
    it) and whether WARNING and ERROR records pass (the sixth and seventh, 1 or 0; both
    without them), one line a record on stderr, which the worker's stderr is."""
    configure_logging("INFO")
    if len(argv) > 4:
        logging.getLogger().setLevel(int(argv[4]))
    if len(argv) > 6:
        _keep_severities(argv[5] != "0", argv[6] != "0")


def _follow_log(state: Any) -> None:
    """Log as the worker's frame says (``[level, format, warnings, errors]``), if it says."""
    if isinstance(state, list) and len(state) in (2, 4) and isinstance(state[0], int):
        copy_log((state[0], "ISO8601" if state[1] == "ISO8601" else "default"))
        if len(state) == 4 and all(isinstance(kept, bool) for kept in state[2:]):
            _keep_severities(state[2], state[3])


def _keep_severities(warnings: bool, errors: bool) -> None:
    """Pass or drop WARNING and ERROR records as the worker does (its ``log_warnings``,
    ``log_errors``), on this process's own handlers (``configure_logging``'s)."""
    settings = LogSettings(log_warnings=warnings, log_errors=errors)
    for handler in logging.getLogger().handlers:
        if not isinstance(handler.formatter, PlazaFormatter):
            continue
        severity_filter(handler).keep(settings)


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
