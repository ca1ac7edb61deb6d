"""Error codes across the Python backend's edge: Triton's numeric codes <-> Plaza's codes.

A model's ``TritonError`` becomes a Plaza error answer with a stable code; a Plaza error
answer to a BLS call becomes the ``TritonError`` of its ``InferenceResponse``. Each Triton
code keeps its meaning through that round trip, so a BLS caller reads the called model's
code back: INVALID_ARG, UNAVAILABLE and CANCELLED are Plaza's own codes of that meaning;
NOT_FOUND, UNSUPPORTED, ALREADY_EXISTS and UNKNOWN, which Plaza's codes have no word for
about a model's answer, travel as ``model_error_<code>`` (``ModelErrorCode``: the gateway
answers them as it answers ``model_error``, 500 and INTERNAL); INTERNAL is ``model_error``.
"""

from __future__ import annotations

from typing import ClassVar

from plaza.errors import ModelExecutionError, PlazaError, error_from_wire
from plaza.workers.backends.pb_utils import TritonError


class ModelErrorCode(ModelExecutionError):
    """A model's error answer whose Triton code Plaza's codes have no word for: a
    ``model_error`` whose code on the wire names the Triton code too."""

    triton: ClassVar[int] = TritonError.INTERNAL


class ModelNotFoundCode(ModelErrorCode):
    """A model's ``TritonError.NOT_FOUND`` (what it looked for is not there; a model that
    is not served is ``model_not_found``)."""

    code = "model_error_not_found"
    triton = TritonError.NOT_FOUND


class ModelUnsupportedCode(ModelErrorCode):
    """A model's ``TritonError.UNSUPPORTED`` (``unsupported`` stays the gateway's and the
    SDK's refusal of a call a decoupled model cannot answer)."""

    code = "model_error_unsupported"
    triton = TritonError.UNSUPPORTED


class ModelAlreadyExistsCode(ModelErrorCode):
    """A model's ``TritonError.ALREADY_EXISTS``."""

    code = "model_error_already_exists"
    triton = TritonError.ALREADY_EXISTS


class ModelUnknownCode(ModelErrorCode):
    """A model's ``TritonError.UNKNOWN``."""

    code = "model_error_unknown"
    triton = TritonError.UNKNOWN


_OWN: dict[str, type[ModelErrorCode]] = {
    cls.code: cls
    for cls in (ModelNotFoundCode, ModelUnsupportedCode, ModelAlreadyExistsCode, ModelUnknownCode)
}
_TO_PLAZA = {
    TritonError.INVALID_ARG: "invalid_input",
    TritonError.UNAVAILABLE: "unavailable",
    TritonError.CANCELLED: "cancelled",
    **{cls.triton: code for code, cls in _OWN.items()},
}
_TO_TRITON = {
    "invalid_input": TritonError.INVALID_ARG,
    "payload_too_large": TritonError.INVALID_ARG,
    "model_not_found": TritonError.NOT_FOUND,
    "unavailable": TritonError.UNAVAILABLE,
    "queue_full": TritonError.UNAVAILABLE,
    "timeout": TritonError.UNAVAILABLE,
    "cancelled": TritonError.CANCELLED,
    "unsupported": TritonError.UNSUPPORTED,
    **{code: cls.triton for code, cls in _OWN.items()},
}


def plaza_code(triton: int) -> str:
    """The Plaza code of a model's TritonError: INVALID_ARG, UNAVAILABLE and CANCELLED keep
    their meaning (invalid_input, unavailable, cancelled: a decoupled model's answer to a
    request whose caller went away, counted as a cancel in ``response_stats``); NOT_FOUND,
    UNSUPPORTED, ALREADY_EXISTS and UNKNOWN are ``model_error_<code>``
    (``ModelErrorCode``); INTERNAL, and any other number, is a model_error."""
    return _TO_PLAZA.get(triton, "model_error")


def triton_code(plaza: str) -> int:
    """The TritonError code of a Plaza error answer (INTERNAL when no closer one exists)."""
    return _TO_TRITON.get(plaza, TritonError.INTERNAL)


def answer_error(code: str, message: str) -> PlazaError:
    """The typed error of a model's error answer (``code`` as ``plaza_code`` made it), for
    the worker to write with that code."""
    own = _OWN.get(code)
    return own(message) if own is not None else error_from_wire(code, message)
