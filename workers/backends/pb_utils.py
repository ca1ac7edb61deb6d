"""``triton_python_backend_utils`` for Plaza: what a Triton ``model.py`` imports as ``pb_utils``.

The Python backend's child process (``python_stub``) puts this module into ``sys.modules``
under Triton's name before it loads ``model.py``, so a Triton user's model runs unchanged.
It holds the parts real model.py files use: tensors, requests, responses, errors, the config
helpers and BLS (``InferenceRequest(...).exec()``, which calls another Plaza model through its
Kafka topic, and ``async_exec()``, its awaitable form), Triton's model loading API
(``load_model``, ``unload_model``, ``is_model_ready``: ``pb_model_loader``) and custom
metrics (``MetricFamily``, ``pb_metrics``). What Triton has and Plaza does not build raises
``TritonModelException`` whose message says "not supported" (shared memory arguments, for
one; a Triton name this module lacks, such as ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``,
raises it too, an ``AttributeError`` as well, so that ``hasattr`` says False). A decoupled
model (``model_transaction_policy { decoupled: true }``) answers through each request's
``get_response_sender()``. Only numpy and Plaza's contract are imported
here; torch only for DLPack, Kafka and Redis only for BLS and model loading.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, overload

import numpy as np

from plaza.contract import INT64_MAX, INT64_MIN
from plaza.workers.backends.pb_exception import TritonModelException as TritonModelException
from plaza.workers.backends.pb_metrics import CustomMetric
from plaza.workers.backends.pb_metrics import MetricFamily as MetricFamily  # model.py's

_log = logging.getLogger("triton_python_backend_utils")

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1


class MemoryType(enum.IntEnum):
    """Triton's preferred memory types (its numbers): accepted, and unused by Plaza."""

    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1


TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU


class PreferredMemory:
    """Where a BLS call would like its outputs (``InferenceRequest(preferred_memory=...)``):
    accepted and unused, as every tensor reaches model code in CPU memory."""

    def __init__(self, preferred_memory_type: int, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = int(preferred_memory_type)
        self.preferred_device_id = int(preferred_device_id)


class MetricKind:
    """Triton's metric kinds, as ``MetricFamily``'s constants."""

    COUNTER: ClassVar[int] = MetricFamily.COUNTER
    GAUGE: ClassVar[int] = MetricFamily.GAUGE
    HISTOGRAM: ClassVar[int] = MetricFamily.HISTOGRAM


Metric = CustomMetric
"""What ``MetricFamily.Metric(...)`` makes."""

# config.pbtxt's data_type names -> numpy types, as Triton's utils map them.
_STRING_TO_NUMPY: dict[str, type[Any]] = {
    "TYPE_BOOL": np.bool_,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}
# TRITONSERVER_DataType numbers (the same as model_config.proto's DataType enum).
_TYPE_NUMBER = {name: i for i, name in enumerate(_STRING_TO_NUMPY, start=1)}
TRITON_STRING_TO_NUMPY = dict(_STRING_TO_NUMPY)
"""Triton's table of config type names to numpy types, by its name (a copy)."""


def not_supported(what: str) -> TritonModelException:
    """The error for a part of Triton's Python backend that Plaza does not build."""
    return TritonModelException(f"{what} is not supported by Plaza's Python backend")


class TritonError:
    """A per-response error (a value, not an exception), with Triton's code constants."""

    UNKNOWN: ClassVar[int] = 0
    INTERNAL: ClassVar[int] = 1
    NOT_FOUND: ClassVar[int] = 2
    INVALID_ARG: ClassVar[int] = 3
    UNAVAILABLE: ClassVar[int] = 4
    UNSUPPORTED: ClassVar[int] = 5
    ALREADY_EXISTS: ClassVar[int] = 6
    CANCELLED: ClassVar[int] = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = str(message)
        self._code = int(code)

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


class Tensor:
    """A named tensor held as a numpy array (always in CPU memory)."""

    def __init__(self, name: str, array: Any) -> None:
        if not isinstance(array, np.ndarray):
            raise TritonModelException(
                f"Tensor {name!r}: expected a numpy array, got {type(array).__name__}"
            )
        if array.dtype.kind in "SU":  # fixed-width strings travel as BYTES elements
            array = array.astype(np.object_)
        self._name = str(name)
        # C order, its shape kept (np.ascontiguousarray would make a 0-d array 1-d)
        self._array: np.ndarray[Any, Any] = np.require(array, requirements="C")

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray[Any, Any]:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> int:
        """The TRITONSERVER_DataType number of the data (``TYPE_FP32``: 11; BYTES: 13)."""
        return numpy_to_triton_type(self._array.dtype)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule of the data (torch needed: Triton's capsules are torch's)."""
        torch = _torch("Tensor.to_dlpack")
        if self._array.dtype.kind == "O":
            raise TritonModelException(f"Tensor {self._name!r}: BYTES tensors have no DLPack form")
        return torch.utils.dlpack.to_dlpack(torch.from_numpy(self._array))

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        """A tensor from a DLPack capsule or an object with ``__dlpack__`` (a GPU tensor is
        copied to the CPU: Plaza hands tensors between processes as bytes)."""
        torch = _torch("Tensor.from_dlpack")
        tensor = torch.utils.dlpack.from_dlpack(capsule)
        return Tensor(name, tensor.detach().cpu().numpy())

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={self.shape()}, dtype={self._array.dtype})"


def _torch(what: str) -> Any:
    try:
        import torch
    except ImportError:
        raise not_supported(f"{what} without torch installed") from None
    return torch


def _json_text(parameters: dict[str, Any] | str | None) -> str:
    """Parameters as Triton hands them to model code: JSON text."""
    return parameters if isinstance(parameters, str) else json.dumps(parameters or {})


def _response_parameters(parameters: dict[str, Any] | str | None) -> dict[str, bool | int | str]:
    """A response's parameters checked as Triton checks them: str keys, bool, int or str
    values (int within 64 bits: what a response parameter holds); a JSON object's text is
    taken too. Anything else raises TritonModelException, naming the parameter."""
    if parameters is None:
        return {}
    if isinstance(parameters, str):
        try:
            parameters = json.loads(parameters)
        except ValueError as exc:
            raise TritonModelException(
                f"InferenceResponse: parameters is not valid JSON: {exc}"
            ) from None
    if not isinstance(parameters, dict):
        raise TritonModelException(
            "InferenceResponse: parameters must be a dict (or a JSON object's text), "
            f"not a {type(parameters).__name__}"
        )
    values: dict[str, bool | int | str] = {}
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(
                "InferenceResponse: expect parameters keys to have type str, found type "
                f"{type(key).__name__} ({key!r})"
            )
        if isinstance(value, bool):
            values[key] = bool(value)
        elif isinstance(value, int) and INT64_MIN <= value <= INT64_MAX:
            values[key] = int(value)
        elif isinstance(value, str):
            values[key] = str(value)
        else:
            kind = "int past 64 bits" if isinstance(value, int) else type(value).__name__
            raise TritonModelException(
                f"InferenceResponse: parameter {key!r}: expect parameters values to have type "
                f"bool/int/str, found {kind}"
            )
    return values


class InferenceResponse:
    """One request's answer: output tensors, or an error; and its parameters, which reach
    the client with the response (checked here, as Triton checks them)."""

    def __init__(
        self,
        output_tensors: Sequence[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        self._outputs = list(output_tensors or [])
        for t in self._outputs:
            if not isinstance(t, Tensor):
                raise TritonModelException(
                    f"InferenceResponse: output_tensors holds a {type(t).__name__}, not a Tensor"
                )
        if error is not None and not isinstance(error, TritonError):
            raise TritonModelException("InferenceResponse: error must be a pb_utils.TritonError")
        self._error = error
        self._values = _response_parameters(parameters)
        """The parameters as they travel (Plaza's process reads them)."""
        self._parameters = json.dumps(self._values) if self._values else "{}"

    def output_tensors(self) -> list[Tensor]:
        return list(self._outputs)

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        """The response's parameters as JSON text, as Triton gives them."""
        return self._parameters


Deliver = Callable[[InferenceResponse | None, bool], None]
"""Where a response sender's responses go: (the response or None, final)."""
Cancelled = Callable[[], bool]
"""Whether a request's caller went away (Plaza's process gives each request that ``execute``
receives one that asks the worker's cancels)."""


def _never() -> bool:
    return False


class InferenceResponseSender:
    """A decoupled model's way to answer one request: any number of ``send`` calls, from
    any thread, during ``execute`` or after it returned; the last one with
    ``flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL`` (a response, or None: then the request
    closes without one). Nothing can be sent after that."""

    def __init__(self, request_id: str, deliver: Deliver, cancelled: Cancelled = _never) -> None:
        self._request_id = request_id
        self._deliver = deliver
        self._cancelled = cancelled
        self._lock = threading.Lock()
        self._closed = False

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        final = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if response is None and not final:
            raise TritonModelException(
                "InferenceResponseSender.send: give a response, or the flag "
                "TRITONSERVER_RESPONSE_COMPLETE_FINAL to close the request without one"
            )
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(
                f"InferenceResponseSender.send: got a {type(response).__name__}, "
                "not a pb_utils.InferenceResponse"
            )
        with self._lock:  # one send at a time, and none after the final one
            if self._closed:
                raise TritonModelException(
                    f"request {self._request_id!r}: its response sender is closed (its final "
                    "response was sent, or its batch ended)"
                )
            self._closed = final
            self._deliver(response, final)

    def close(self) -> None:
        """Refuse further sends (the batch ended without them)."""
        with self._lock:
            self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def is_cancelled(self) -> bool:
        """Whether the request's caller went away while the model answers it (a closed
        gRPC stream or generate_stream, a cancelled SDK stream): the model may stop early;
        it still closes the request (its responses after that reach no one)."""
        return self._cancelled()


class ResponseStream(Protocol):
    """One decoupled BLS call's responses as the transport hands them over: the call is
    already sent when the transport returns this."""

    def next(self) -> InferenceResponse | None:
        """The next response, waiting for it; None once there are no more."""

    async def anext(self) -> InferenceResponse | None:
        """``next``, awaited on the caller's event loop (which it leaves free meanwhile)."""

    def cancel(self) -> None:
        """Cancel the call at once, from any thread (a wait for a response ends)."""


BlsCall = Callable[["InferenceRequest", float], InferenceResponse]
BlsStream = Callable[["InferenceRequest", float], "ResponseStream | Iterator[InferenceResponse]"]
_bls_call: BlsCall | None = None
"""How ``InferenceRequest.exec`` reaches another model; the Python backend's process sets it."""
_bls_stream: BlsStream | None = None
"""How ``InferenceRequest.exec(decoupled=True)`` does: each response as it comes."""


def set_bls_call(call: BlsCall | None, stream: BlsStream | None = None) -> None:
    """Install the BLS transport (Plaza's child process does; unset outside it)."""
    global _bls_call, _bls_stream
    _bls_call = call
    _bls_stream = stream


class _IteratedStream:
    """A transport's plain iterator as a ``ResponseStream`` (a call that failed before it
    was sent, a test's fake transport): it starts when first asked, and a ``cancel()`` from
    another thread than the one waiting for a response takes effect once that response
    came."""

    def __init__(self, responses: Iterator[InferenceResponse]) -> None:
        self._responses = responses
        self._cancelled = False

    def next(self) -> InferenceResponse | None:
        if self._cancelled:
            self._close()
            return None
        return next(self._responses, None)

    async def anext(self) -> InferenceResponse | None:
        return await asyncio.get_running_loop().run_in_executor(None, self.next)

    def cancel(self) -> None:
        self._cancelled = True
        with contextlib.suppress(ValueError):  # iterated on another thread: closed at its next
            self._close()

    def _close(self) -> None:
        close = getattr(self._responses, "close", None)
        if callable(close):
            close()


class ResponseIterator:
    """What ``InferenceRequest.exec(decoupled=True)`` returns, and what ``await
    async_exec(decoupled=True)`` resolves to: the called model's responses as they come,
    with ``for`` (each wait blocks the thread, as Triton's) or with ``async for`` (each
    wait leaves the event loop free).

    ``cancel()`` cancels the call at once, from any thread: Plaza's transport stores the
    caller's ``cancelled`` answer for the called request (so the called model's
    ``is_cancelled()`` turns True, and a request it has not run yet is skipped), a wait for
    a response ends, and the iteration ends there."""

    def __init__(self, responses: ResponseStream | Iterator[InferenceResponse]) -> None:
        if isinstance(responses, Iterator):
            responses = _IteratedStream(responses)
        self._responses = responses

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        response = self._responses.next()
        if response is None:
            raise StopIteration
        return response

    def __aiter__(self) -> ResponseIterator:
        return self

    async def __anext__(self) -> InferenceResponse:
        response = await self._responses.anext()
        if response is None:
            raise StopAsyncIteration
        return response

    def cancel(self) -> None:
        """Cancel the BLS call (nothing happens once its last response came)."""
        self._responses.cancel()


class InferenceRequest:
    """A request: one that ``execute`` receives, or one a model sends to another (BLS)."""

    def __init__(
        self,
        model_name: str = "",
        requested_output_names: Sequence[str] = (),
        inputs: Sequence[Tensor] = (),
        request_id: str = "",
        correlation_id: int | str = 0,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        parameters: dict[str, Any] | str | None = None,
        preferred_memory: Any = None,
        trace: Any = None,
        **unsupported: Any,
    ) -> None:
        # preferred_memory and trace are accepted and unused: tensors live in CPU memory.
        if unsupported:
            raise not_supported(f"InferenceRequest({', '.join(sorted(unsupported))}=...)")
        self.model_name = model_name
        self.model_version = int(model_version)
        self._outputs = [str(n) for n in requested_output_names]
        self._inputs = list(inputs)
        self._request_id = str(request_id)
        self._correlation_id = correlation_id
        self._flags = int(flags)
        self._timeout_us = int(timeout)
        self._parameters = _json_text(parameters)
        self._sender: InferenceResponseSender | None = None
        """A decoupled model's request: its response sender (set by Plaza's process)."""
        self._cancelled: Cancelled = _never
        """A request that ``execute`` receives: asks the worker's cancels (set by Plaza's
        process); a request the model makes (BLS) is never cancelled."""

    def inputs(self) -> list[Tensor]:
        return list(self._inputs)

    def requested_output_names(self) -> list[str]:
        return list(self._outputs)

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        """TRITONSERVER_REQUEST_FLAG_SEQUENCE_START (1) and _END (2), as set: for a request
        that ``execute`` receives, its ``sequence_start`` and ``sequence_end``."""
        return self._flags

    def timeout(self) -> int:
        """Microseconds (0: none), as Triton's BLS request takes it; for a request that
        ``execute`` receives, the time its caller gave it (to its deadline)."""
        return self._timeout_us

    def parameters(self) -> str:
        """The request's parameters as JSON text, as Triton gives them."""
        return self._parameters

    def is_cancelled(self) -> bool:
        """Whether the request's caller went away while ``execute`` runs it (a cancelled
        call, a closed stream; the worker looks every 0.1 s), for any model: it may stop
        early and answer ``TritonError(..., TritonError.CANCELLED)`` (a decoupled model
        still closes the request); its answer reaches no one. False for a BLS request."""
        return self._cancelled()

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            raise TritonModelException(
                "InferenceRequest.get_response_sender: only a decoupled model's requests have "
                "one (model_transaction_policy { decoupled: true } in config.pbtxt)"
            )
        return self._sender

    @overload
    def exec(self, decoupled: Literal[False] = False) -> InferenceResponse: ...

    @overload
    def exec(self, decoupled: Literal[True]) -> ResponseIterator: ...

    def exec(self, decoupled: bool = False) -> InferenceResponse | ResponseIterator:
        """Run this request on the Plaza model ``model_name`` and wait for its answer (BLS).

        An error of the called model comes back as the response's error, as in Triton. With
        ``decoupled=True`` the call is sent at once, and an iterator of the called model's
        responses, each as it comes (a decoupled model's many, an ordinary model's one), is
        returned; the last one is empty (no output tensors) when the model closed the
        request without a response; its ``cancel()`` cancels the call (``ResponseIterator``).
        ``timeout`` (microseconds), and the deadline of the request the caller is running,
        become the called request's deadline: past it the call ends with a TritonError
        (``UNAVAILABLE``, as Triton's timed-out request) and the called request is
        cancelled."""
        if not self.model_name:
            raise TritonModelException("InferenceRequest.exec: model_name is required")
        timeout_s = self._timeout_us / 1e6
        if decoupled:
            if _bls_stream is None:
                raise _outside_the_backend()
            return ResponseIterator(_bls_stream(self, timeout_s))
        if _bls_call is None:
            raise _outside_the_backend()
        return _bls_call(self, timeout_s)

    def async_exec(self, decoupled: bool = False) -> asyncio.Future[Any]:
        """``exec`` as an awaitable, for an ``async def execute``: the call waits on a thread
        of the running loop's executor, so several BLS calls gathered run side by side.
        With ``decoupled=True`` it resolves, once the call is sent, to its
        ``ResponseIterator``: ``async for`` takes each response as it comes, leaving the
        loop free; ``cancel()`` cancels the call."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise TritonModelException(
                "InferenceRequest.async_exec must be awaited inside an async def execute"
            ) from None
        if decoupled:
            return loop.run_in_executor(None, lambda: self.exec(decoupled=True))
        return loop.run_in_executor(None, self.exec)


def _outside_the_backend() -> TritonModelException:
    return TritonModelException(
        "InferenceRequest.exec runs only inside Plaza's Python backend process"
    )


class ModelLoading(Protocol):
    """What ``load_model``, ``unload_model`` and ``is_model_ready`` reach: Plaza's process
    sets one (``pb_model_loader.ModelLoader``) for ``initialize`` and ``execute``."""

    def load(self, name: str, config: str, files: dict[str, bytes] | None) -> None: ...

    def unload(self, name: str, unload_dependents: bool) -> None: ...

    def ready(self, name: str, version: str) -> bool: ...


_model_loading: ModelLoading | None = None
_model_loading_phase = ""
"""Where the model loading API is refused ("finalize", "auto_complete_config"); "" for
outside Plaza's Python backend process."""


def set_model_loading(loading: ModelLoading | None, phase: str = "") -> None:
    """Install the model loading API (Plaza's process does, for ``initialize`` and
    ``execute``), or refuse it from now on, naming the ``phase`` that may not use it."""
    global _model_loading, _model_loading_phase
    _model_loading = loading
    _model_loading_phase = phase


def _loading(what: str) -> ModelLoading:
    if _model_loading is not None:
        return _model_loading
    if _model_loading_phase:
        raise TritonModelException(
            f"{what} is not supported during {_model_loading_phase} (the model loading API "
            "runs in initialize and execute)"
        )
    raise TritonModelException(
        f"{what} runs only inside Plaza's Python backend process, in initialize and execute"
    )


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Triton's model loading API: load (or reload) ``model_name`` for the deployment, with
    ``config`` (Triton's JSON form, a string) in place of its config.pbtxt when given, and
    return once a worker serves it. ``files`` (file overrides) are refused: a model's files
    must be in the repository. Raises TritonModelException on failure, and unless the model
    control mode is explicit."""
    _loading("load_model").load(model_name, config, files)


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Triton's model loading API: unload ``model_name`` (its workers answer what is queued,
    then stop), and the loaded ensembles that call it, as Triton's; with ``unload_dependents``,
    also the step models loaded only along with ``model_name`` (an ensemble). Raises
    TritonModelException on failure, and unless the model control mode is explicit."""
    _loading("unload_model").unload(model_name, unload_dependents)


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether ``model_name`` (``model_version``; "": any) is loaded and a live worker serves
    it."""
    return _loading("is_model_ready").ready(model_name, model_version)


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors() if t.name() == name), None)


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return _config_entry(model_config, "input", name)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return _config_entry(model_config, "output", name)


def _config_entry(model_config: dict[str, Any], kind: str, name: str) -> dict[str, Any] | None:
    for entry in model_config.get(kind, []):
        if entry.get("name") == name:
            return dict(entry)
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


def triton_string_to_numpy(triton_type_string: str) -> type[Any]:
    """``"TYPE_FP32"`` -> ``numpy.float32`` (``TYPE_STRING`` -> ``numpy.object_``)."""
    try:
        return _STRING_TO_NUMPY[triton_type_string]
    except KeyError:
        raise TritonModelException(f"unknown Triton data type {triton_type_string!r}") from None


def triton_to_numpy_type(data_type: int) -> type[Any]:
    """A TRITONSERVER_DataType number (``TYPE_FP32`` is 11) -> its numpy type."""
    for name, number in _TYPE_NUMBER.items():
        if number == data_type:
            return _STRING_TO_NUMPY[name]
    raise TritonModelException(f"unknown Triton data type number {data_type}")


def numpy_to_triton_type(data_type: Any) -> int:
    """A numpy type -> its TRITONSERVER_DataType number (strings are TYPE_STRING)."""
    dtype = np.dtype(data_type)
    if dtype.kind in "OSU":
        return _TYPE_NUMBER["TYPE_STRING"]
    for name, np_type in _STRING_TO_NUMPY.items():
        if np_type is not np.object_ and np.dtype(np_type) == dtype:
            return _TYPE_NUMBER[name]
    raise TritonModelException(f"numpy type {dtype} has no Triton data type")


def serialize_byte_tensor(input_tensor: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Triton's BYTES layout (uint32 LE length, then the bytes, per element, in C order) as
    uint8. Elements as Triton takes them: bytes as they are, any other element of an object
    array as ``str(x)`` in UTF-8 (``300`` is ``b"300"``); a ``bytes_`` or ``str_`` array's
    elements as their bytes. An array of any other dtype (numbers) raises
    TritonModelException: it has no BYTES form."""
    if input_tensor.dtype.kind not in "OSU":
        raise TritonModelException(
            f"serialize_byte_tensor: a {input_tensor.dtype} array is not a BYTES tensor (give "
            "an object, bytes or str array)"
        )
    parts: list[bytes] = []
    for item in input_tensor.reshape(-1, order="C"):
        raw = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(struct.pack("<I", len(raw)))
        parts.append(raw)
    return np.frombuffer(b"".join(parts), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor: bytes | np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Inverse of serialize_byte_tensor: a 1-D object array of bytes."""
    data = bytes(encoded_tensor)
    items: list[bytes] = []
    pos = 0
    while pos < len(data):
        if pos + 4 > len(data):
            raise TritonModelException("BYTES tensor truncated in a length prefix")
        (length,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if pos + length > len(data):
            raise TritonModelException("BYTES tensor element runs past the data")
        items.append(data[pos : pos + length])
        pos += length
    out = np.empty(len(items), dtype=np.object_)
    out[:] = items
    return out


class _LogLevel(enum.IntEnum):
    """Triton's log levels (its numbers), as ``Logger.log`` takes them: ``Logger.LogLevel``,
    each also ``Logger``'s own (``Logger.INFO``)."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_LEVELS = {
    _LogLevel.INFO: logging.INFO,
    _LogLevel.WARNING: logging.WARNING,
    _LogLevel.ERROR: logging.ERROR,
    _LogLevel.VERBOSE: logging.DEBUG,
}


class Logger:
    """Triton's ``pb_utils.Logger``: messages go to the worker's log (the model process's
    stderr, at the worker's level: VERBOSE shows at DEBUG). A change of the log settings at
    run time holds from the model's next batch on (each batch's frame carries the worker's
    level)."""

    LogLevel = _LogLevel
    INFO: ClassVar[_LogLevel] = _LogLevel.INFO
    WARNING: ClassVar[_LogLevel] = _LogLevel.WARNING
    ERROR: ClassVar[_LogLevel] = _LogLevel.ERROR
    VERBOSE: ClassVar[_LogLevel] = _LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: int = _LogLevel.INFO) -> None:
        """``message`` at ``level`` (``Logger.INFO``, ``WARNING``, ``ERROR``, ``VERBOSE``);
        TritonModelException for any other level."""
        try:
            python_level = _LEVELS[_LogLevel(level)]
        except (ValueError, TypeError):
            raise TritonModelException(
                f"Logger.log: level {level!r} is not Logger.INFO, WARNING, ERROR or VERBOSE"
            ) from None
        _log.log(python_level, "%s", message)

    @staticmethod
    def log_info(message: str) -> None:
        _log.info("%s", message)

    @staticmethod
    def log_warn(message: str) -> None:
        _log.warning("%s", message)

    @staticmethod
    def log_error(message: str) -> None:
        _log.error("%s", message)

    @staticmethod
    def log_verbose(message: str) -> None:
        _log.debug("%s", message)


_NOT_BUILT = {
    "TRITONSERVER_REQUEST_RELEASE_ALL": "request rescheduling",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE": "request rescheduling",
    "InferenceTrace": "tracing from model code (InferenceTrace)",
    "SharedMemory": "Triton's shared memory manager (SharedMemory)",
}
"""Names Triton's pb_utils has and this module does not, with what they are for."""


class NotSupportedName(TritonModelException, AttributeError):
    """A Triton pb_utils name that Plaza does not build: TritonModelException for model
    code, AttributeError so that ``hasattr`` and ``getattr(..., default)`` say it is not
    here."""


if not TYPE_CHECKING:  # mypy keeps checking every name used from this module

    def __getattr__(name: str) -> Any:
        what = _NOT_BUILT.get(name)
        if what is None:
            raise AttributeError(
                f"module 'triton_python_backend_utils' has no attribute {name!r}", name=name
            )
        raise NotSupportedName(f"{name} ({what}) is not supported by Plaza's Python backend")


from plaza.workers.backends.pb_model_config import ModelConfig as ModelConfig  # noqa: E402
