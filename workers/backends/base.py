"""The backend interface and the factory that picks one by platform."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeGuard, runtime_checkable

import msgspec
import numpy as np

from plaza.contract import InferRequest, Scalar
from plaza.errors import ConfigError, PlazaError
from plaza.modelconfig import BACKEND_PYTHON, BACKEND_SIMULATED, PLATFORM_ONNX, PLATFORM_TORCH
from plaza.repository import ModelVersion
from plaza.settings import PlazaSettings
from plaza.tensors import Tensor
from plaza.workers.device import Device

Arrays = dict[str, np.ndarray[Any, Any]]


class Response(msgspec.Struct, frozen=True):
    """A request's outputs with the parameters its model attached to the response (Triton's
    Python backend: ``InferenceResponse(parameters={...})``)."""

    outputs: tuple[Tensor, ...]
    parameters: Mapping[str, Scalar]


Answer = tuple[Tensor, ...] | Response | PlazaError
"""One request's answer from a RequestBackend: its requested outputs in order (a Response
when the model gave the response parameters, a plain tuple when not), or its error."""


class Backend(Protocol):
    """Runs one model version. ``infer`` is called from one executor thread at a time."""

    device: Device

    def load(self) -> None: ...

    def infer(self, inputs: Arrays, outputs: list[str]) -> Arrays:
        """Inputs by name (batch first) -> the requested outputs by name."""
        ...

    def unload(self) -> None: ...


@runtime_checkable
class RequestBackend(Protocol):
    """A backend that takes a batch as its requests, not as stacked arrays (Triton's Python
    backend): the runner calls ``execute_requests`` instead of ``infer``."""

    def execute_requests(self, requests: Sequence[InferRequest]) -> list[Answer]:
        """One answer per request, in order. Raises when the batch failed as a whole (the
        runner then splits it to find the request that fails on its own)."""
        ...


Send = Callable[[int, Answer | None, bool], None]
"""A decoupled batch's responses as they come: (request index, its answer or None for a
final flag without a response, final)."""


@runtime_checkable
class DecoupledBackend(Protocol):
    """A backend whose model may answer a request many times (Triton's decoupled models:
    the Python backend): ``execute_decoupled`` hands on each response as it comes."""

    def execute_decoupled(self, requests: Sequence[InferRequest], send: Send) -> None:
        """Returns once every request got its final response; raises when the batch
        failed (its open requests then get the error)."""
        ...


@runtime_checkable
class CancellableBackend(Protocol):
    """A backend whose model can hear, while it runs a batch, that a request's caller went
    away (Triton's ``request.is_cancelled()``: the Python backend, any of its models)."""

    def running(self) -> list[str]:
        """The ids of the requests running now that were not cancelled (any thread)."""
        ...

    def cancel(self, ids: Sequence[str]) -> None:
        """Tell the model these running requests' callers went away (any thread)."""
        ...


def streams_responses(backend: object) -> TypeGuard[DecoupledBackend]:
    """``isinstance(backend, DecoupledBackend)``, asked of its class (see ``takes_requests``)."""
    return issubclass(type(backend), DecoupledBackend)


def hears_cancels(backend: object) -> TypeGuard[CancellableBackend]:
    """``isinstance(backend, CancellableBackend)``, asked of its class."""
    return issubclass(type(backend), CancellableBackend)


def takes_requests(backend: object) -> TypeGuard[RequestBackend]:
    """``isinstance(backend, RequestBackend)``, asked of its class: the same answer for a
    backend's methods, in 0.1 µs instead of the 7 that a protocol's isinstance costs (it
    looks each member up with ``inspect.getattr_static``), and the runner asks per batch."""
    return issubclass(type(backend), RequestBackend)


def thread_count(mv: ModelVersion, configured: int) -> int:
    """Intra-op threads: the config's ``intra_op_thread_count`` parameter, else the
    worker setting, else every core. A parameter of 0 or less counts as left out, as in
    Triton's ONNX Runtime backend (there it means the runtime's own default)."""
    param = mv.spec.parameters.get("intra_op_thread_count", "")
    if param:
        try:
            count = int(param)
        except ValueError:
            raise ConfigError(
                f"{mv.spec.name}: parameter intra_op_thread_count={param!r} is not an integer",
                field="parameters.intra_op_thread_count",
            ) from None
        if count > 0:
            return count
    return configured or (os.cpu_count() or 1)


def create_backend(
    mv: ModelVersion, device: Device, threads: int = 0, settings: PlazaSettings | None = None
) -> Backend:
    """The backend for ``mv``'s platform. torch is imported only for pytorch_libtorch.

    ``settings`` carry the worker's ONNX Runtime options (spinning) and reach the Python
    backend's BLS calls; without them ONNX Runtime gets the settings' defaults and a Python
    model process reads the PLAZA_* environment it inherits."""
    if mv.spec.platform == PLATFORM_ONNX:
        from plaza.workers.backends.onnx import OnnxBackend, SessionTuning

        tuning = SessionTuning.from_settings(settings.worker) if settings else None
        return OnnxBackend(mv, device, thread_count(mv, threads), tuning)
    if mv.spec.platform == PLATFORM_TORCH:
        from plaza.workers.backends.torch import TorchBackend

        return TorchBackend(mv, device, thread_count(mv, threads))
    if mv.spec.platform == BACKEND_SIMULATED:
        from plaza.workers.backends.simulated import SimulatedBackend

        return SimulatedBackend(mv)
    if mv.spec.platform == BACKEND_PYTHON:
        from plaza.workers.backends.python_backend import PythonBackend

        return PythonBackend(mv, device, settings)
    raise ConfigError(f"{mv.spec.name}: no backend for platform {mv.spec.platform!r}")
